"""Operator artifacts generated from code: recording and alert rules, Grafana dashboards and
their provisioning. Everything here reads names from :mod:`auditor.metrics.catalog`."""
