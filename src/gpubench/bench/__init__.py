"""One module per command: a frozen Spec -> run(spec, progress) -> Result."""
