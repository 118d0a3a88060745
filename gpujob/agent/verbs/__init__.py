"""The short commands the laptop calls through ``gpujob/agent/main.py``: jobs' lives
(lifecycle: submit, status, a supervisor's revival), ``stop`` and ``rollback`` (control),
the file commands (files), ``tail``, ``cache``, ``fleet`` and ``gc`` (prune). Each runs,
answers one JSON document and exits; they may import every wing below them.
"""
