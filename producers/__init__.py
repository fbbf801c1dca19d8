"""The webhook receiver, source definitions, dedupe and the producer API."""
