"""gunicorn hooks for bench/http.py: a line per worker once it has loaded the
application, so the benchmark starts its clock only when every worker serves."""


def post_worker_init(worker):
    worker.log.info("bench: worker %s loaded the application", worker.pid)
