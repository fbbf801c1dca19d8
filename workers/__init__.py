"""The worker side: lanes that own shards and apply each record's events.

Ownership (leases, fencing, handoff), the lanes and their Redis gateway, the write
discipline (``apply.py``) and dead letters, destinations (tasks, HTTP forwards, resources:
records that live elsewhere), keylane's own store (``stores/``), and the Celery worker that
hosts the lanes. Imports the contract and ``routing``; never ``producers``.
"""
