from marlkit.cli import command

raise SystemExit(command())
