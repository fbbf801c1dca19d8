"""Operations: the ``keylane`` CLI, the supervisor, triage, status, benchmarks."""
