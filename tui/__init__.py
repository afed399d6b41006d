"""`lingcode chat`: the terminal chat and agent UI, a Textual app that talks to the daemon over HTTP only
(lingcode.client.DaemonLink finds, starts and re-finds it).

    app.py           the app: layout, the answer loop, agent tool calls, daemon trouble
    commands.py      /commands (the table and their actions; the palette offers the same)
    conversation.py  stored messages -> OpenAI messages; the streamed reply read back
    attachments.py   @path: attach a file, complete paths
    launch.py        `lingcode chat` arguments -> a running app
    store/           sessions in SQLite (WAL), Markdown export
    tools/           the agent's tools and the permission rules
    widgets/         the widgets and screens, each with its .tcss
"""
