"""Operations: the ``keylane`` command (``cli*.py``), ``keylane up``'s supervisor and
embedded Redis, triage of dead letters, status, health, audit, Sentry, benchmarks
(``bench/``, not shipped). May import everything below it; nothing below imports it.
"""
