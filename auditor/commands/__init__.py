"""Every command's code, one module per command (or group of commands), as :mod:`auditor.cli`
dispatches them: :mod:`.run`, :mod:`.fleet`, :mod:`.doctor`, :mod:`.probe_path`,
:mod:`.reports` (analyze, report, compare), :mod:`.serve`, :mod:`.dashboards` and
:mod:`.replay`.

Each takes the command's frozen config (:mod:`auditor.configs`) that the CLI built, and returns
the exit status. A command composes the layers below it (the domain packages, the audit, the
report) and holds no parser: argv and the ``AUDITOR_*`` twins are the CLI's. This package
imports none of its modules itself, so the CLI pays only for the command it runs.
"""
