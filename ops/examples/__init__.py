"""Example configuration: a sources file and a mapping hook."""
