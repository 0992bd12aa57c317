"""Notifications where people read them: a job's events (it ended, its GPU sat idle, it is stuck) and
the queue running empty, sent to the URLs of `--notify URL` through Apprise (ntfy://, tgram://,
slack://, json://...).

Apprise is heavy to import and talks to the network: gpuq's own processes never import it. The
process that saw an event (a job's supervisor, or the worker) starts `python -m
gpuq.run.notify.sender` in a session of its own, hands it the message on stdin and does not wait
for it (send.py); the sender gives each destination at most GPUQ_NOTIFY_TIMEOUT seconds and logs a
failure, without the URL's secrets, in the log of the process that sent. message.py says what a
message carries; config.py the user's default destinations.
"""
