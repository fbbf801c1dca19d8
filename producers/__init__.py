"""The producer side: events come in here and are accepted into their shard queues.

The webhook receiver (``receiver.py``: verify, parse, map, accept), the Python sender
(``sender.py``), signature schemes (``signatures/``), the receiver's Redis gateway (the
one atomic accept script: dedupe + high-water mark + push) and its metrics. Imports the
contract and ``routing``; never ``workers``.
"""
