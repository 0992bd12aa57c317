"""Notifications to the URLs of `--notify URL` through Apprise, which is heavy and talks to the
network: gpuq's processes never import it, they start `python -m gpuq.run.notify.sender` (send.py).
"""
