# Read by train.py with exec(): each argument without '=' is a config file run in place,
# each --key=value replaces a global train.py set (its type kept). Our own, in nanoGPT's way.
import sys as _sys
from ast import literal_eval as _literal

for _arg in _sys.argv[1:]:
    if "=" not in _arg:
        exec(open(_arg).read())
        continue
    _key, _val = _arg[2:].split("=", 1)
    if _key not in globals():
        raise ValueError(f"Unknown config key: {_key}")
    try:
        _val = _literal(_val)
    except (SyntaxError, ValueError):
        pass
    if type(_val) is not type(globals()[_key]):
        raise TypeError(f"{_key}: expected {type(globals()[_key]).__name__}, got {_val!r}")
    globals()[_key] = _val
