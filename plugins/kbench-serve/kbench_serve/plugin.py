"""The ``serve`` command (registered through ``kbench_register_commands``); FastAPI and uvicorn are imported
only when the command runs, so ``kbench list`` and every other command stay as light as without this plugin."""
from __future__ import annotations

import click

from kbench.api import BadInput, hookimpl


@click.command("serve")
@click.option("--tasks", "tasks_dir", required=True, type=click.Path(file_okay=False),
              help="folder of task files (YAML: id, suite, baseline, held_out, ...)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8787, show_default=True, type=int)
@click.option("--allow-remote", is_flag=True,
              help="listen on an address other than loopback (tokens required); see docs/serve.md, Security")
@click.option("--db", default="kbench-serve.sqlite", show_default=True, type=click.Path(dir_okay=False),
              help="SQLite file of every evaluation (WAL); a restarted server finishes what it holds")
@click.option("--tokens", "tokens_file", default=None, type=click.Path(dir_okay=False),
              help="file of bearer tokens (NAME:TOKEN per line); also KBENCH_SERVE_TOKENS")
@click.option("--slots", default=1, show_default=True, type=click.IntRange(1, 64),
              help="evaluations at once (one per device)")
@click.option("--max-queue", default=10_000, show_default=True, type=click.IntRange(1, 10_000_000))
@click.option("--max-body", default=1_048_576, show_default=True, type=click.IntRange(1024, 64 * 1_048_576),
              help="bytes of a request body")
@click.option("--body-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="seconds a request body may take to arrive")
@click.option("--rate", default=10.0, show_default=True, type=click.FloatRange(0.001, 1e6),
              help="evaluations per second per token")
@click.option("--burst", default=100, show_default=True, type=click.IntRange(1, 10_000_000))
def serve(tasks_dir, host, port, allow_remote, db, tokens_file, slots, max_queue, max_body, body_timeout,
          rate, burst) -> None:
    """Serve kbench's judge over HTTP for RL rollouts and evolvers (docs/serve.md)."""
    from kbench_serve.app import Settings, create_app, is_loopback, read_tokens
    from kbench_serve.tasks import load_tasks

    tokens = read_tokens(tokens_file)
    if not is_loopback(host):
        if not allow_remote:
            raise BadInput(f"--host {host} is not a loopback address", where="--host",
                           fix="keep the default 127.0.0.1, or add --allow-remote with tokens (docs/serve.md, Security)")
        if not tokens:
            raise BadInput(f"--host {host} with --allow-remote needs bearer tokens", where="--tokens",
                           fix="give --tokens FILE or KBENCH_SERVE_TOKENS (docs/serve.md, Security)")
    tasks = load_tasks(tasks_dir)
    settings = Settings(db=db, tokens=tokens, slots=slots, max_queue=max_queue, max_body=max_body,
                        body_timeout=body_timeout, rate=rate, burst=burst)
    app = create_app(tasks, settings)
    import uvicorn

    click.echo(f"kbench serve: {len(tasks)} task(s) ({', '.join(tasks)}), {slots} slot(s), "
               f"{'tokens' if tokens else 'no tokens (loopback only)'}, db {db}; http://{host}:{port}/docs",
               err=True)
    # limit_concurrency: connections beyond it get 503 before any work; h11's header size cap stays default
    uvicorn.run(app, host=host, port=port, log_level="warning", limit_concurrency=1024, timeout_keep_alive=5,
                timeout_graceful_shutdown=5)


@hookimpl
def kbench_register_commands(cli) -> None:
    cli.add_command(serve)
