"""The agent's home on disk: the job journal (``H/jobs/<id>/``), the known-good ledger, the
fenced per-container lock, the relay of phase logs into job.log, the trimming of a long
job's journal, compile-cache snapshots, venv garbage collection and the checkpoint register
(which files each run of a job wrote, found by globbing and polling). Imports ``base``
only (never ``judge``): it keeps records, it does not decide.
"""
