"""What the receiver and the lanes share: events, wire messages, settings, errors, source
definitions. No I/O happens here; both sides look down to it."""
