"""What the receiver and the lanes share: events, the wire message, settings, the sources
file's models, errors, flow-control state, Redis scripts (as text). Both sides look down to
it; it imports only :mod:`keylane.routing`.

Models and parsing only. It reads the two configuration inputs a process starts from (the
``KEYLANE_*`` environment in :mod:`.settings`, loaded by :mod:`.settings_env`, the sources
file in :func:`.sources.load_sources`) and nothing else: no client library (each side's
gateway talks to Redis, maps its errors and reads replies with :mod:`.replies`), no user
code (the receiver imports hooks, the lanes import handlers), no network.
"""
