#!/bin/sh
# Starts one rank's Python process and writes when it started and ended (wall clock, from
# outside the process) to $TIMED_DIR/rank$RANK.start and .end: the e2e account test's yardstick.
date +%s.%N > "$TIMED_DIR/rank$RANK.start"
python "$@"
code=$?
date +%s.%N > "$TIMED_DIR/rank$RANK.end"
exit $code
