"""The spec's defaults for the agent: gpujob/agent/base/spec_defaults.json is generated
from spec.py's models (the one place defaults are defined; notify's and metrics'
in spec_notify.py, which spec.py imports); tests/unit/test_spec.py checks
it is up to date. Regenerate with
``python -m gpujob.spec.defaults > gpujob/agent/base/spec_defaults.json``."""

from __future__ import annotations

import json

from pydantic import BaseModel

from gpujob.spec.model import (Caches, Checkpoint, JobSpec, Journal, Metrics, Restarts, Rollback, Throughput,
                               Train, Warmup, Webhook)


#: the sections whose defaults the agent needs for a job.json that lacks a key
AGENT_DEFAULT_SECTIONS: dict[str, type[BaseModel]] = {"caches": Caches, "journal": Journal,
                                                      "rollback": Rollback,
                                                      "throughput": Throughput, "train": Train,
                                                      "warmup": Warmup,
                                                      "restarts": Restarts,  # train.restarts
                                                      "checkpoint": Checkpoint,  # train.checkpoint
                                                      # notify: each webhook's
                                                      "notify": Webhook, "metrics": Metrics}


def agent_defaults() -> dict:
    """Each section's field defaults, and the sections every spec has (``_always``)."""
    from pydantic_core import to_jsonable_python
    out: dict = {name: {f: to_jsonable_python(info.get_default(call_default_factory=True))
                        for f, info in model.model_fields.items() if not info.is_required()}
                 for name, model in AGENT_DEFAULT_SECTIONS.items()}
    out["_always"] = sorted(n for n in AGENT_DEFAULT_SECTIONS
                            if n in JobSpec.model_fields and JobSpec.model_fields[n].default_factory)
    return out


def agent_defaults_json() -> str:
    return json.dumps(agent_defaults(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(agent_defaults_json(), end="")
