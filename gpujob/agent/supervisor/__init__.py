"""One job's owner in the container and what it drives: the supervisor and its phases, the
watch loop over a phase command (its pause and trace side, a metrics file source), the
venv installer, the standby interpreter, the compile-cache keeper, the checkpoint side,
the verdicts it carries out, the end-of-job safeguards, the boot hook, hung trainers and
their stacks, webhook notifications and the metrics textfile. Imports ``base``, ``judge``,
``home`` and ``fleet``; nothing below it imports it.
"""
