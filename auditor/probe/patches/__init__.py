"""The torch patches the probe installs: one module per patch, each read and changed on its own.

``auditor.probe.hooks.attach`` installs them all, each under ``try``: if one cannot attach, the
job runs untouched and its phase is reported as not measured.
"""
