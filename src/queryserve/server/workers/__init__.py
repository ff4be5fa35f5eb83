"""`queryserve serve --workers N`: several server processes that clients see as one server.

- `supervisor.py`: the process the user starts; it spawns the workers on one port, forwards
  signals, replaces a worker that dies;
- `peers.py`: how a worker reaches its siblings (figures, load and unload, what they serve);
- `plan.py`: how many workers `--workers auto` starts, and why.
"""
