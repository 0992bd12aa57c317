"""`gpuq top`: the machine's GPUs and the queue, live, full screen (command.py: the command;
model.py: what is shown; draw.py: the frames; keys.py, logview.py, app.py: the curses loop). Imported
only when `top` runs: cli/commands.py names `top.command:cmd_top` as its handler."""
