"""What each `lynx` command does once cli.py has parsed its options: one module per command (or group of commands),
beside the pieces they share (terminal, tables, options, user_code, helptext, choices)."""
