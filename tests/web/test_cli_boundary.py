"""The `klaud` command's edges: one line and exit 2 or 1, never a traceback (issue 11), plus
--version and KLAUD_LOG_LEVEL (issue 13). The failure rows run the real command in a process."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot.cli import main
from bot.core.domain import parse_time
from bot.sandbox import load_scenario
from bot.store import open_stores
from bot.store.lockfile import PidLock
from tests import scenarios as sc
from tests.harness import SECRET, sandbox_stack

ROOT = Path(__file__).resolve().parents[2]


def klaud_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("KLAUD_")}
    return env | {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_LOG_FORMAT": "json"} | extra


def run_klaud(args: list[str], env: dict[str, str], **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot", *args], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, **options)


def one_line(stderr: str) -> str:
    """The one line for people; anything else on stderr must be a JSON log line."""
    plain = [line for line in stderr.splitlines() if not is_json(line)]
    assert len(plain) == 1, stderr
    return plain[0]


def is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@pytest.mark.parametrize(
    "variable, names",
    [("KLAUD_HOST", "KLAUD_HOST/KLAUD_PORT"), ("KLAUD_ADMIN_HOST", "KLAUD_ADMIN_HOST/KLAUD_ADMIN_PORT")],
)
def test_a_host_that_cannot_be_bound_is_one_line_naming_it_and_exit_2(tmp_path, variable, names):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding it fails, nothing is sent.
    env = klaud_env(tmp_path, KLAUD_WEBHOOK_SECRET=SECRET, KLAUD_PORT="0", KLAUD_ADMIN_PORT="0", **{variable: "192.0.2.1"})
    done = run_klaud(["serve", "--sandbox"], env)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"klaud: {names}: cannot listen on 192.0.2.1:0")


async def test_plan_into_a_closed_pipe_exits_1_without_a_traceback(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()):
        pass  # leaves a store with acme/bench's state, so `plan` has a table to print
    returncode, stderr = await asyncio.to_thread(plan_into_a_closed_pipe, klaud_env(tmp_path))
    assert returncode == 1
    # Nothing but the JSON log lines: no traceback, no "Exception ignored" at exit.
    assert all(is_json(line) for line in stderr.splitlines()), stderr
    assert all(json.loads(line)["level"] != "error" for line in stderr.splitlines()), stderr


def plan_into_a_closed_pipe(env: dict[str, str]) -> tuple[int, str]:
    process = subprocess.Popen([sys.executable, "-m", "bot", "plan"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # like `klaud plan | head` once head has gone
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


def test_a_corrupted_store_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "klaud.db").write_bytes(b"this is not a SQLite file " * 400)
    done = run_klaud(["plan"], klaud_env(tmp_path))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "KLAUD_DB" in line or str(tmp_path / "klaud.db") in line


def test_receive_an_unknown_event_name_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps({"action": "opened"}))
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'r.db'}")
    assert main(["receive", "--event", "pullrequest", "--payload", str(payload)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("klaud: --event: unknown event name 'pullrequest'") and "pull_request" in line


def test_version_prints_klaud_and_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"klaud {metadata.version('klaud')}\n"


def test_an_invalid_log_level_exits_2_naming_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KLAUD_LOG_LEVEL", "loud")
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'l.db'}")
    assert main(["plan"]) == 2
    assert one_line(capsys.readouterr().err).startswith("klaud: KLAUD_LOG_LEVEL:")


@pytest.mark.parametrize(
    ("env", "says"),
    [
        # asyncpg read these only when connecting, with a traceback and exit 1.
        ({"KLAUD_DB": "postgresql://klaud:pw@db:notaport/klaud"}, "KLAUD_DB: not a PostgreSQL URL"),
        ({"KLAUD_DB": "postgresql://klaud:pw@db:5432"}, "KLAUD_DB: postgresql:// needs a database name"),
        ({"KLAUD_BOT_LOGINS": " , "}, "KLAUD_BOT_LOGINS: names no login"),
        ({"KLAUD_PRIVATE_KEY_FILE": "KEY"}, "KLAUD_PRIVATE_KEY_FILE: not an unencrypted PEM private key"),
    ],
)
def test_bad_settings_name_the_variable_that_was_set(tmp_path, env, says):
    from bot.settings import SettingsError, load_settings

    not_a_key = tmp_path / "app.pem"
    not_a_key.write_text("this is no key\n")
    with pytest.raises(SettingsError) as refused:
        load_settings({name: str(not_a_key) if value == "KEY" else value for name, value in env.items()})
    assert str(refused.value).startswith(says) and "pw" not in str(refused.value)


@pytest.mark.parametrize("variable", ["KLAUD_GITHUB_URL", "KLAUD_CAPACITY_URL"])
@pytest.mark.parametrize("url", ["https://ghe.example.com:443333/api/v3", "https://[::1/api/v3", "http://", "http://host:port"])
def test_an_http_url_without_a_host_or_a_port_in_range_is_refused_naming_the_variable(variable, url):
    # What this catches: only the `http(s)://` prefix was checked; the GitHub client read the
    # port at its first request and the command ended with a traceback.
    from bot.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match=f"^{variable}: "):
        load_settings({variable: url})


def test_doctor_with_a_github_url_whose_port_is_out_of_range_exits_2_in_one_line(tmp_path):
    # With the App's identity set, the doctor reaches the GitHub client: its first request
    # ended with a traceback and exit 1.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "key.pem").write_bytes(pem)
    env = klaud_env(tmp_path, KLAUD_APP_ID="1", KLAUD_PRIVATE_KEY_FILE=str(tmp_path / "key.pem"),
                    KLAUD_GITHUB_URL="https://ghe.example.com:443333/api/v3")
    done = run_klaud(["doctor"], env)
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    assert done.returncode == 2
    assert one_line(done.stderr).startswith("klaud: KLAUD_GITHUB_URL: not a URL")


@pytest.mark.parametrize("password", ["Zm9vYmFy/c2VjcmV0", "S3cr#etPassw0rd", "8675/SECRETTAIL", "hunter2?xyzzy/plugh"])
def test_a_password_that_is_not_percent_encoded_is_never_quoted(password):
    # What this catches: urlsplit cut such a password into the port or the path, and the
    # refusal (or, for `8675/SECRETTAIL`, every connection error) quoted those parts.
    from bot.settings import SettingsError, load_settings
    from bot.store.postgres import PostgresDatabase

    url = f"postgresql://klaud:{password}@127.0.0.1:5432/klaud"
    with pytest.raises(SettingsError) as refused:
        load_settings({"KLAUD_DB": url})
    assert str(refused.value).startswith("KLAUD_DB: not a PostgreSQL URL")
    assert "percent-encoded" in str(refused.value)
    for part in password.replace("#", "/").replace("?", "/").split("/"):
        assert part not in str(refused.value)
        assert part not in PostgresDatabase(url).where


def test_an_at_sign_in_a_query_parameters_value_is_a_valid_postgresql_url():
    # What this catches: the check above refused `?user=sa@project.iam` (Cloud SQL's IAM
    # users), which asyncpg connects with.
    from bot.settings import load_settings

    url = "postgresql://127.0.0.1:5432/klaud?user=sa@project.iam"
    assert load_settings({"KLAUD_DB": url}).db == url


def test_log_level_is_read_in_any_case(tmp_path):
    from bot.settings import load_settings

    assert load_settings({"KLAUD_LOG_LEVEL": "WARNING"}).log_level == "warning"


async def test_receive_while_a_server_holds_the_sqlite_store_is_refused_in_one_line(tmp_path):
    """Issue 11's row: `klaud receive` must not write behind a running server's back. On
    SQLite the server's lock refuses it (replicas on PostgreSQL: tests/stack/test_cli_replicas.py)."""
    payload = tmp_path / "hold.json"
    payload.write_text(json.dumps({"action": "created", "comment": {"body": "/klaud hold"}}))
    serving = await open_stores(f"sqlite:///{tmp_path / 'klaud.db'}")  # what `klaud serve` holds
    try:
        done = await asyncio.to_thread(
            run_klaud, ["receive", "--event", "issue_comment", "--payload", str(payload)], klaud_env(tmp_path)
        )
    finally:
        await serving.close()
    assert done.returncode == 1 and done.stdout == ""
    assert one_line(done.stderr) == (f"klaud: KLAUD_DB: {tmp_path / 'klaud.db'} is in use by another Klaud process"
                                     f" (pid {os.getpid()})")


def test_a_strict_sandbox_without_the_app_key_exits_2_naming_the_setting(tmp_path):
    done = run_klaud(["sandbox", "--strict-auth", "--port", "0"], klaud_env(tmp_path))
    assert done.returncode == 2
    assert "KLAUD_APP_ID" in one_line(done.stderr)


def test_a_sandbox_on_a_port_it_cannot_have_exits_2_in_one_line(tmp_path):
    # What this catches: `klaud sandbox` bound with aiohttp's TCPSite: a port out of range,
    # a busy one or an unknown host ended with a traceback and exit 1.
    done = run_klaud(["sandbox", "--port", "70000"], klaud_env(tmp_path))
    assert done.returncode == 2 and "'70000' is not a port (0-65535)" in done.stderr
    assert "Traceback" not in done.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = run_klaud(["sandbox", "--port", str(busy.getsockname()[1])], klaud_env(tmp_path, KLAUD_HOST="127.0.0.1"))
    assert done.returncode == 2
    assert one_line(done.stderr).startswith("klaud: KLAUD_HOST/--port: cannot listen on 127.0.0.1:")


def test_ctrl_c_on_a_command_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    # What this catches: Ctrl-C on `klaud receive` (a handler waiting on GitHub) printed a
    # KeyboardInterrupt traceback: only serve, sandbox and demo handle the signal themselves.
    async def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.setattr("bot.cli._run", interrupted)
    assert main(["plan"]) == 130
    assert capsys.readouterr().err == "klaud: interrupted\n"


async def test_a_strict_sandbox_takes_only_jwts_signed_with_the_app_key(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = klaud_env(tmp_path, KLAUD_APP_ID="42", KLAUD_PRIVATE_KEY=pem.decode(), KLAUD_HOST="127.0.0.1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "sandbox", "--strict-auth", "--port", str(port), cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        started = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        assert started.startswith("sandbox GitHub at ")
        api = started.split()[-1]
        # Signed for the sandbox's clock (the scenario's time), as GitHub checks its own.
        now = int(parse_time(load_scenario(None)["now"]).timestamp())
        signed = jwt.encode({"iat": now - 60, "exp": now + 540, "iss": "42"}, key, algorithm="RS256")
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode({"iat": now - 60, "exp": now + 540, "iss": "42"}, other, algorithm="RS256")
        async with aiohttp.ClientSession() as http:
            for token, status in ((signed, 200), (forged, 401), ("any-token", 401)):
                async with http.get(f"{api}/app", headers={"Authorization": f"Bearer {token}"}) as answer:
                    assert answer.status == status, token
    finally:
        proc.terminate()
        await proc.wait()


def test_a_private_key_file_that_is_not_text_is_refused_in_one_line_naming_the_variable(tmp_path):
    # What this catches: a DER or other binary key file ending `klaud serve` with a UnicodeDecodeError traceback.
    from bot.settings import SettingsError, load_settings

    binary = tmp_path / "app.der"
    binary.write_bytes(b"\x30\x82\x04\xa4\x02\x01\x00\x02\x82\x01\x01\x00\xc3\xff")
    with pytest.raises(SettingsError, match="^KLAUD_PRIVATE_KEY_FILE: .* is not a PEM text file$"):
        load_settings({"KLAUD_PRIVATE_KEY_FILE": str(binary)})


def test_serve_needs_the_current_webhook_secret_not_only_the_previous_one():
    # What this catches: a server started with only KLAUD_WEBHOOK_SECRET_PREVIOUS, the secret
    # that is on its way out, as if it were the current one.
    from bot.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="^KLAUD_WEBHOOK_SECRET: required"):
        load_settings({"KLAUD_WEBHOOK_SECRET_PREVIOUS": "old"}, require_secret=True)
    assert load_settings({"KLAUD_WEBHOOK_SECRET": "new", "KLAUD_WEBHOOK_SECRET_PREVIOUS": "old"},
                         require_secret=True).secrets() == ["new", "old"]


def test_plan_on_a_sqlite_store_that_is_not_there_exits_2_and_creates_nothing(tmp_path):
    # What this catches: a mistyped KLAUD_DB creating, migrating and planning an empty store, exit 0.
    done = run_klaud(["plan"], klaud_env(tmp_path, KLAUD_DB=f"sqlite:///{tmp_path / 'typo.db'}"))
    assert done.returncode == 2
    assert one_line(done.stderr) == f"klaud: KLAUD_DB: no store at {tmp_path / 'typo.db'} (`klaud serve` or `klaud reconcile` creates it)"
    assert list(tmp_path.iterdir()) == []


def test_a_klaud_db_through_a_symlink_loop_is_refused_naming_the_variable(tmp_path):
    # What this catches: Path.resolve raised RuntimeError on the loop inside the settings
    # check, a traceback before the CLI's boundary instead of one line naming KLAUD_DB.
    from bot.settings import SettingsError, load_settings

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(SettingsError, match="^KLAUD_DB: the folder of .*/loop/klaud.db does not exist$"):
        load_settings({"KLAUD_DB": f"sqlite:///{tmp_path / 'loop' / 'klaud.db'}"})


@pytest.mark.parametrize("command", [["serve", "--sandbox"], ["plan"]])
def test_a_klaud_db_naming_a_folder_exits_2_in_one_line_naming_it(tmp_path, monkeypatch, capsys, command):
    # What this catches (a review found it): only the folder around the path was checked;
    # the store's lock then failed to open the folder itself, a traceback and exit 1.
    folder = tmp_path / "state"
    folder.mkdir()
    for name, value in {"KLAUD_DB": f"sqlite:///{folder}", "KLAUD_PORT": "0", "KLAUD_ADMIN_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    assert one_line(capsys.readouterr().err) == (
        f"klaud: KLAUD_DB: {folder} is a folder, not a SQLite file (sqlite:///{folder}/klaud.db?)")


@pytest.mark.parametrize("command", [["serve", "--sandbox"], ["plan"]])
def test_a_store_whose_lock_cannot_be_written_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, command):
    # What this catches (a review found it): an OSError opening the SQLite file or its lock
    # (here a folder in the way of the pid file; permission denied, a read-only file system
    # alike) ended the command with a traceback.
    (tmp_path / "klaud.db").touch()  # an empty file is a new SQLite database
    (tmp_path / "klaud.db.lock").mkdir()
    for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_PORT": "0", "KLAUD_ADMIN_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 1
    assert one_line(capsys.readouterr().err) == f"klaud: KLAUD_DB: cannot write {tmp_path / 'klaud.db.lock'}: Is a directory"


async def test_plan_on_a_store_without_repositories_says_so(tmp_path):
    # What this catches: an empty store planned in silence, as if every repository had nothing to do.
    await (await open_stores(f"sqlite:///{tmp_path / 'klaud.db'}")).close()  # an empty, migrated store
    done = await asyncio.to_thread(run_klaud, ["plan"], klaud_env(tmp_path))
    assert (done.returncode, done.stdout) == (0, "")
    assert "no repository has local state" in one_line(done.stderr)


@pytest.mark.parametrize("command", [["receive", "--event", "push", "--payload"], ["config", "check"]])
def test_a_file_without_end_is_refused_in_one_line_not_read_whole(tmp_path, monkeypatch, capsys, command):
    # What this catches: `klaud receive --payload /dev/zero` (or a huge file, a pipe) read
    # whole into memory until a MemoryError traceback; the webhook refuses such a body (413).
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'r.db'}")
    assert main([*command, "/dev/zero"]) == 2
    assert one_line(capsys.readouterr().err).endswith("/dev/zero is over " + (
        "26214400 bytes" if command[0] == "receive" else "1048576 bytes"))


def _at_most_a_gigabyte_of_memory() -> None:
    """A child that reads without bound dies of a MemoryError, not taking the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("command", [["demo", "--once"], ["sandbox", "--port", "0"], ["serve", "--sandbox"]])
@pytest.mark.parametrize("content", ["endless", "nested"])
def test_a_scenario_file_without_end_or_nested_too_deep_is_refused_in_one_line(tmp_path, command, content):
    # `--scenario /dev/zero` (a pipe, a huge file named by mistake) was read whole: a
    # MemoryError traceback; an array nested 100,000 deep, a RecursionError traceback.
    scenario = tmp_path / "deep.json"
    scenario.write_text("[" * 100_000 + "]" * 100_000)
    path = "/dev/zero" if content == "endless" else str(scenario)
    env = klaud_env(tmp_path, KLAUD_PORT="0", KLAUD_ADMIN_PORT="0")
    done = run_klaud([*command, "--scenario", path], env, preexec_fn=_at_most_a_gigabyte_of_memory)
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 2
    assert one_line(done.stderr).startswith(f"klaud: {path}: ")


def test_a_private_key_file_without_end_is_refused_in_one_line_not_read_whole(tmp_path):
    # What this catches (a review found it): KLAUD_PRIVATE_KEY_FILE=/dev/zero (or a huge
    # file, a pipe) was read whole, before the CLI's boundary: a MemoryError traceback.
    env = klaud_env(tmp_path, KLAUD_APP_ID="1", KLAUD_PRIVATE_KEY_FILE="/dev/zero")
    done = run_klaud(["doctor"], env, preexec_fn=_at_most_a_gigabyte_of_memory)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        "klaud: KLAUD_PRIVATE_KEY_FILE: /dev/zero is over 65536 bytes; a PEM private key is a few KB")


def test_a_private_key_file_is_read_up_to_64_kib(tmp_path):
    from bot.settings import SettingsError, load_settings

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    key_file = tmp_path / "app.pem"
    key_file.write_bytes(pem.ljust(64 * 1024, b"\n"))  # the key, then blank lines up to the bound
    assert load_settings({"KLAUD_PRIVATE_KEY_FILE": str(key_file)}).private_key.get_secret_value().startswith(
        "-----BEGIN PRIVATE KEY-----")
    key_file.write_bytes(pem.ljust(64 * 1024 + 1, b"\n"))
    with pytest.raises(SettingsError, match=f"^KLAUD_PRIVATE_KEY_FILE: {key_file} is over 65536 bytes"):
        load_settings({"KLAUD_PRIVATE_KEY_FILE": str(key_file)})


async def test_receive_of_a_payload_its_handler_cannot_read_logs_one_warning_without_a_traceback(tmp_path):
    # What this catches: a permanent error (a push without `ref`) logged with a traceback,
    # as a bug is, where the inbox logs it as a failed delivery with its reason.
    payload = tmp_path / "push.json"
    payload.write_text(json.dumps({"repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}))
    done = await asyncio.to_thread(run_klaud, ["receive", "--event", "push", "--payload", str(payload)], klaud_env(tmp_path))
    assert done.returncode == 1 and json.loads(done.stdout)["status"] == "failed"
    [failed] = [json.loads(line) for line in done.stderr.splitlines() if is_json(line) and "receive.failed" in line]
    assert failed["permanent"] is True and "ValidationError" in failed["error"] and "exception" not in failed


@contextlib.contextmanager
def an_admin_port_answering(answers: dict[str, bytes]):
    """A port that answers 200 with `answers[path]` (or `answers["*"]`), as a service that is
    not Klaud (or a proxy's page) on KLAUD_ADMIN_PORT does; yields the port."""

    class NotKlaud(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answers.get(self.path.split("?")[0], answers.get("*", b"{}"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotKlaud)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


# A plan of the right keys whose family is a number: the table cannot print it.
FOREIGN_PLAN = json.dumps({"repo": "acme/bench", "at": "2026-11-30T09:00:00Z", "base": "abc", "wave": 1, "decisions": [
    {"family": 7, "candidate": "c", "decision": "selected", "reason": "r"}]}).encode()


@pytest.mark.parametrize(
    "answers, args",
    [
        ({"*": b"{}"}, ["plan"]),
        ({"*": b"[]"}, ["plan"]),
        ({"*": b'{"repos": "acme/bench"}'}, ["plan"]),
        ({"*": b'{"repos": ["acme/bench"]}'}, ["plan"]),
        ({"*": b'{"repos": ["acme/bench"]}'}, ["plan", "--json"]),
        ({"*": b'{"decisions": [1]}'}, ["plan", "--repo", "acme/bench"]),
        ({"/api/v1/repos": b'{"repos": ["acme/bench"]}', "*": FOREIGN_PLAN}, ["plan"]),
    ],
)
def test_plan_through_an_admin_port_that_answers_not_as_klaud_is_refused_in_one_line(
        tmp_path, monkeypatch, capsys, answers, args):
    # What this catches: `klaud plan` indexing the admin API's answer (`["repos"]`, the wave
    # document) outside the code that refuses in one line: a KeyError or TypeError traceback.
    db = tmp_path / "klaud.db"
    db.touch()
    lock = PidLock(str(db))
    lock.acquire()  # what a running `klaud serve` holds: plan asks its admin port
    try:
        with an_admin_port_answering(answers) as port:
            for name, value in {"KLAUD_DB": f"sqlite:///{db}", "KLAUD_ADMIN_PORT": str(port),
                                "KLAUD_LOG_FORMAT": "json"}.items():
                monkeypatch.setenv(name, value)
            for name in ("KLAUD_ADMIN_TOKEN", "KLAUD_ADMIN_HOST"):
                monkeypatch.delenv(name, raising=False)
            assert main(args) == 1
    finally:
        lock.release()
    printed = capsys.readouterr()
    assert printed.out == ""
    assert one_line(printed.err).startswith(f"klaud: the admin API at http://127.0.0.1:{port}/api/v1/repos")


def test_plan_on_a_klaud_db_whose_file_name_is_too_long_is_one_line_not_a_traceback(tmp_path):
    # `plan`'s "no store there" check used Path.exists(), which raises ENAMETOOLONG
    # (Python 3.11 swallows only ENOENT/ENOTDIR/EBADF/ELOOP): a traceback, exit 1, where
    # `serve` and `receive` say "KLAUD_DB: cannot open …: File name too long" in one line.
    db = tmp_path / ("a" * 300 + ".db")
    done = run_klaud(["plan"], klaud_env(tmp_path, KLAUD_DB=f"sqlite:///{db}"))
    assert "Traceback" not in done.stderr
    assert one_line(done.stderr).startswith("klaud: KLAUD_DB: ")
    assert done.returncode in (1, 2)


@pytest.mark.parametrize("command", [["demo", "--once"], ["sandbox", "--port", "0"], ["serve", "--sandbox"]])
def test_a_scenario_file_that_is_not_utf8_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, command):
    # load_scenario caught OSError and JSONDecodeError but not UnicodeDecodeError:
    # `--scenario` naming a binary file (a .gz, an image) ended in a traceback, exit 1.
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(b"\xae\xff{}")
    for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_PORT": "0", "KLAUD_ADMIN_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main([*command, "--scenario", str(scenario)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"klaud: {scenario}: ")


def test_a_private_key_that_is_not_rsa_is_refused_at_start_up_naming_the_variable(tmp_path, monkeypatch, capsys):
    # any PEM private key passed the settings check; GitHub App keys are RSA and
    # the JWT is RS256, so an EC key (a TLS key named by mistake) failed at the first
    # GitHub call with PyJWT's InvalidKeyError traceback, exit 1, instead of one line, exit 2.
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "app.pem").write_bytes(key)
    for name, value in {"KLAUD_APP_ID": "1", "KLAUD_PRIVATE_KEY_FILE": str(tmp_path / "app.pem"),
                        "KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_GITHUB_URL": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KLAUD_PRIVATE_KEY", raising=False)
    assert main(["doctor"]) == 2
    assert one_line(capsys.readouterr().err).startswith("klaud: KLAUD_PRIVATE_KEY_FILE: ")


def test_serve_with_a_scenario_but_without_the_sandbox_is_refused(capsys):
    # Served against real GitHub, the scenario was ignored with no word.
    assert main(["serve", "--scenario", "x.json"]) == 2
    assert "--scenario plays a scenario in the sandbox: add --sandbox" in capsys.readouterr().err


def test_receive_refuses_a_delivery_id_the_webhook_would_refuse(tmp_path, capsys, monkeypatch):
    # Stored under it, the delivery was one the admin API cannot look up (it answers 404 to
    # ids no webhook could have stored), while `receive` told the person to follow it there.
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'klaud.db'}")
    payload = tmp_path / "ping.json"
    payload.write_text("{}")
    assert main(["receive", "--event", "ping", "--payload", str(payload), "--delivery", "rerun of 12"]) == 2
    assert one_line(capsys.readouterr().err) == "klaud: --delivery: 1-200 printable ASCII characters without spaces, and not . or .."
