"""Reads a chorus metrics file (node-<id>.jsonl) for the experiment scripts in bench/."""
import json
import sys


def load(path, _cache={}):
    """The events of `path`, in order; each file is read once.

    A node killed while writing leaves its last line cut short: such a line (or any that is
    not a JSON object with an "event") is skipped with a note on stderr, as chorus report
    does (report/run_metrics.cc).
    """
    if path not in _cache:
        events = []
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as e:
                    print(f"{path}:{number}: not a JSON object ({e}), skipped", file=sys.stderr)
                    continue
                if not isinstance(event, dict) or "event" not in event:
                    print(f'{path}:{number}: no "event" field, skipped', file=sys.stderr)
                    continue
                events.append(event)
        _cache[path] = events
    return _cache[path]
