"""`gpuq web`: the queue in a browser (an optional extra, Starlette on uvicorn). command.py is the
handler, app.py the ASGI application, data.py what the pages show and do, static/ the page itself
(HTML, CSS and a script, shipped inside the package: no CDN, no build step)."""
