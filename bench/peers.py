"""Peers benchmark (issue 15): the same webhook load against Klaud and two peers, in one run.

Load (bench/ingest.py's): N signed 24 KB `pull_request` `synchronize` deliveries from C
concurrent clients over loopback. Servers, each in a child process on 127.0.0.1:

- klaud: the real listeners, durable SQLite inbox (fsync before the 202) and worker, with the
  handler stubbed like bench/ingest.py (tests/helpers/slow_server.py: the real handler's
  one parse of the body, then nothing);
- probot: a minimal Probot app installed from the npm registry into a temporary folder
  (`probot run`, a no-op `pull_request` handler; Probot verifies the signature), skipped
  with the reason when Node.js or npm is missing or the install fails;
- bedevere: an aiohttp + gidgethub router bot handling each event inside the request, as
  python/bedevere does (signature verified by gidgethub's `Event.from_http`).

Each row prints deliveries/s, p50, p99 and the server's CPU per delivery (utime + stime of
/proc/<pid>/stat around the sending) and the load generator's; the Klaud row also prints its
drain: deliveries/s from the first request until the last delivery was processed, and its CPU
per delivery over that time (Klaud processes a burst once its acknowledgements are out, so
the CPU around the sending leaves most processing out). Neither peer keeps a delivery.

Last line: {"klaud_per_s", "klaud_p99_ms", "probot_per_s", "bedevere_per_s",
"klaud_to_probot", "drain_per_s"} (null for a row that could not run).
Targets (reported, not asserted): ack >= 2,500/s, p99 < 25 ms, >= 0.9x Probot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import Load, Sent, make_load, median_round, send, wait_drained
from tests.harness import SECRET
from tests.helpers.slow_server import SCRIPT as KLAUD_SERVER
from tests.helpers.slow_server import wait_for_urls
from tests.ports import free_port

TICK = os.sysconf("SC_CLK_TCK")
PROBOT_VERSION = "14"
PROBOT_APP = """\
export default (app) => {
  app.on("pull_request", async () => {});
};
"""
WARM_UP = 300  # deliveries sent before measuring: imports, JIT and connection pools settle


@dataclass
class Running:
    """A server under load: where its webhook is, and its process (for CPU time)."""

    webhook_url: str
    process: subprocess.Popen
    admin_url: str | None = None  # Klaud only: where the drain is watched

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


@dataclass
class Figures:
    name: str
    sent: Sent
    cpu_ms_per_delivery: float
    drain_per_s: float | None = None
    drain_cpu_ms_per_delivery: float | None = None  # from the first request until all processed

    def line(self) -> str:
        drain = (f", drained {self.drain_per_s:.0f}/s end to end, server CPU until drained"
                 f" {self.drain_cpu_ms_per_delivery:.3f} ms/delivery" if self.drain_per_s else "")
        return (f"{self.name:9s} {self.sent.per_s:8.1f} deliveries/s  p50 {self.sent.p50_ms:6.2f} ms  "
                f"p99 {self.sent.p99_ms:6.2f} ms  server CPU {self.cpu_ms_per_delivery:.3f} ms/delivery"
                f" (client {self.sent.client_cpu_ms:.3f})"
                f"  ({len(self.sent.accepted)} accepted){drain}")


def measure(name: str, server: Running, load: Load, clients: int, warm_up: Load) -> Figures:
    asyncio.run(send([server.webhook_url], warm_up, clients))
    if server.admin_url:
        asyncio.run(wait_drained(server.admin_url))
    cpu_before, started = server.cpu_seconds(), time.perf_counter()
    sent = asyncio.run(send([server.webhook_url], load, clients))
    cpu = server.cpu_seconds() - cpu_before
    drain = drain_cpu = None
    if server.admin_url:
        asyncio.run(wait_drained(server.admin_url))
        drain = len(load.bodies) / (time.perf_counter() - started)
        drain_cpu = (server.cpu_seconds() - cpu_before) * 1000 / len(load.bodies)
    return Figures(name, sent, cpu * 1000 / len(load.bodies), drain, drain_cpu)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- the servers -------------------------------------------------------------------------


@contextmanager
def klaud(tmp: Path) -> Iterator[Running]:
    # A folder per start: each round's Klaud begins with an empty store, and the URLs file
    # read is the one this server wrote (a previous round's names a closed port).
    folder = Path(tempfile.mkdtemp(prefix="klaud-", dir=tmp))
    urls_file = folder / "urls"
    process = subprocess.Popen([sys.executable, str(KLAUD_SERVER), str(folder / "klaud.db"), str(urls_file), "0"],
                               stderr=subprocess.DEVNULL)
    try:
        url, admin_url = wait_for_urls(urls_file, process)
        yield Running(f"{url}/webhook", process, admin_url)
    finally:
        stop(process)
        # Each round writes ~150 MB: removed, a later round does not share the disk with its
        # writeback while it fsyncs (the only server here that keeps its deliveries).
        shutil.rmtree(folder)


def install_probot(folder: Path) -> str | None:
    """Install Probot into `folder`; the reason it could not be, or None."""
    if not (shutil.which("node") and shutil.which("npm")):
        return "Node.js or npm is not installed"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(json.dumps({"name": "probot-peer", "private": True, "type": "module"}))
    (folder / "app.js").write_text(PROBOT_APP)
    try:
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", f"probot@{PROBOT_VERSION}"],
                       cwd=folder, check=True, capture_output=True, text=True, timeout=600)
    except subprocess.CalledProcessError as exc:
        return f"npm install probot@{PROBOT_VERSION} failed: {(exc.stderr or exc.stdout).strip().splitlines()[-1:]}"
    except subprocess.TimeoutExpired:
        return f"npm install probot@{PROBOT_VERSION} took over 10 minutes"
    return None


@contextmanager
def probot(folder: Path) -> Iterator[Running]:
    from bot.runtime import generate_app_key

    (folder / "key.pem").write_text(generate_app_key()[0])
    port = free_port()
    env = {**os.environ, "APP_ID": "1", "PRIVATE_KEY_PATH": str(folder / "key.pem"), "WEBHOOK_SECRET": SECRET,
           "HOST": "127.0.0.1", "PORT": str(port), "WEBHOOK_PATH": "/webhook", "LOG_LEVEL": "warn",
           "NODE_ENV": "production"}
    process = subprocess.Popen([str(folder / "node_modules" / ".bin" / "probot"), "run", "./app.js"], cwd=folder,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/", process)
        yield Running(f"http://127.0.0.1:{port}/webhook", process)
    finally:
        stop(process)


@contextmanager
def bedevere(tmp: Path) -> Iterator[Running]:
    urls_file = Path(tempfile.mkdtemp(prefix="bedevere-", dir=tmp)) / "urls"  # one per start, as Klaud's
    process = subprocess.Popen([sys.executable, __file__, "--serve-bedevere", str(urls_file)],
                               stderr=subprocess.DEVNULL)
    try:
        url, _ = wait_for_urls(urls_file, process)
        yield Running(f"{url}/webhook", process)
    finally:
        stop(process)


def serve_bedevere(urls_file: Path) -> None:
    """The bedevere-style peer: verify, route, handle inside the request, answer 200."""
    from aiohttp import web
    from gidgethub import routing, sansio

    router = routing.Router()

    @router.register("pull_request", action="synchronize")
    async def synchronize(event: sansio.Event) -> None:
        return None

    async def webhook(request: web.Request) -> web.Response:
        event = sansio.Event.from_http(request.headers, await request.read(), secret=SECRET)
        await router.dispatch(event)
        return web.Response(status=200)

    async def main() -> None:
        app = web.Application(client_max_size=25 * 1024 * 1024)
        app.router.add_post("/webhook", webhook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.create_server(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        urls_file.with_suffix(".partial").write_text(json.dumps({"url": url, "admin_url": url}))
        urls_file.with_suffix(".partial").replace(urls_file)
        await asyncio.Event().wait()

    asyncio.run(main())


def wait_until_serving(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers, even if not with 200
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing served {url} within {timeout:g} s")


# -- the run -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the median round is reported")
    parser.add_argument("--probot-dir", type=Path, help="reuse a Probot install (default: a new temporary folder)")
    parser.add_argument("--serve-bedevere", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bedevere:
        serve_bedevere(args.serve_bedevere)
        return
    results: dict[str, list[Figures]] = {"klaud": [], "probot": [], "bedevere": []}
    with tempfile.TemporaryDirectory(prefix="klaud-peers-") as tmp_name:
        tmp = Path(tmp_name)
        probot_dir = args.probot_dir or tmp / "probot"
        skipped = install_probot(probot_dir)
        if skipped:
            print(f"probot row skipped: {skipped}")
        servers = {"klaud": lambda: klaud(tmp), "bedevere": lambda: bedevere(tmp)}
        if not skipped:
            servers["probot"] = lambda: probot(probot_dir)
        for round_number in range(args.rounds):
            for name, start in list(servers.items()):
                # Fresh delivery ids each time: Klaud would answer a repeated id as a duplicate.
                load, warm_up = make_load(args.deliveries), make_load(WARM_UP)
                try:
                    with start() as server:
                        figures = measure(name, server, load, args.clients, warm_up)
                except RuntimeError as exc:
                    if name != "probot":
                        raise
                    print(f"probot row skipped: {exc}")
                    del servers[name]
                    continue
                print(f"round {round_number + 1}: {figures.line()}")
                results[name].append(figures)
    report({name: median_round(rounds) for name, rounds in results.items() if rounds})


def report(best: dict[str, Figures]) -> None:
    klaud_row = best["klaud"]
    print()
    for figures in best.values():
        ratio = figures.sent.per_s / klaud_row.sent.per_s
        print(f"{figures.line()}  [{ratio:.2f}x Klaud]")
    probot_row = best.get("probot")
    print(f"targets: ack >= 2,500/s: {klaud_row.sent.per_s:.0f}/s; p99 < 25 ms: {klaud_row.sent.p99_ms:.1f} ms; "
          f">= 0.9x Probot: {'n/a' if not probot_row else f'{klaud_row.sent.per_s / probot_row.sent.per_s:.2f}x'}; "
          f"drain >= 1,500/s: {klaud_row.drain_per_s:.0f}/s")
    print(json.dumps({
        "klaud_per_s": round(klaud_row.sent.per_s, 1),
        "klaud_p99_ms": round(klaud_row.sent.p99_ms, 2),
        "probot_per_s": round(probot_row.sent.per_s, 1) if probot_row else None,
        "bedevere_per_s": round(best["bedevere"].sent.per_s, 1),
        "klaud_to_probot": round(klaud_row.sent.per_s / probot_row.sent.per_s, 2) if probot_row else None,
        "drain_per_s": round(klaud_row.drain_per_s, 1) if klaud_row.drain_per_s else None,
    }))


if __name__ == "__main__":
    main()
