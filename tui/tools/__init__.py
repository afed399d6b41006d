"""The agent's tools, run by the chat on this machine.

calls.py        the tool table (LocalTool), the model's calls to it (Call), their schemas
files.py        read_file, list_dir, grep, apply_edit, write_file; ToolError
shell.py        run_command
permissions.py  the rules: which calls run, ask or are refused
"""
