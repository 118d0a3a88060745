"""The spec's defaults, for the agent (stdlib only).

gpujob/spec/model.py is the one place defaults are defined. The controller writes every
value into job.json (``JobSpec.to_agent_dict``), so the agent normally finds them
all there; a job.json written by an older gpujob may lack a key added since, and
then the agent takes it from spec_defaults.json: generated from spec.py
(gpujob/spec/defaults.py; tests/unit/test_spec.py checks it is up to date and says
how to regenerate it) and shipped in the agent zip.
"""

from __future__ import annotations

import json
import pkgutil

_RAW = pkgutil.get_data("gpujob.agent.base", "spec_defaults.json")
if _RAW is None:  # a loader that cannot read data files (the agent's, a directory or its zip, can)
    raise ImportError("gpujob.agent.base: this loader cannot read spec_defaults.json")
DEFAULTS: dict = json.loads(_RAW)


def section(spec: dict, name: str):
    """``spec[name]`` completed with the defaults of the keys it lacks; None when an
    optional section (throughput, warmup) is absent."""
    given = spec.get(name)
    if given is None and name not in DEFAULTS["_always"]:
        return None
    return {**DEFAULTS[name], **(given or {})}
