"""Screenshots of an MLflow experiment as a user sees it: ``mlflow ui`` on 127.0.0.1 + headless Chromium.

    python scripts/tools/dashboard_snapshot.py --tracking-uri sqlite:///$PWD/runs/tune/mlflow.db \
        --experiment quickstart_cartpole_muzero --out docs/img

Starts ``mlflow ui`` for the store on a free local port, waits until it answers, opens the experiment in
headless Chromium (Debian's ``chromium`` package) and saves, at ``--width`` x ``--height`` pixels:

- ``<out>/mlflow_runs.png``: the experiment's runs table (model training view);
- ``<out>/mlflow_charts.png``: its chart view in the shared view ``muzero-tune compare`` prints (runs
  grouped by the ``pipeline`` tag, reward and throughput first, x = env steps);
- ``<out>/mlflow_compare.png``: with ``--compare-run``, that run's reward-vs-env-steps plot in its artifacts.

Then it stops the server and Chromium. Chromium is driven through its DevTools protocol (a websocket,
``websockets`` is installed with MLflow's server) so the script can wait for the charts to be drawn and
close MLflow's assistant panel; without ``websockets`` it falls back to Chromium's own ``--screenshot``.
Exit status 2 with one line when Chromium or the store is missing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from muzero_tune.runs.mlflow_log import experiment_url, run_url  # noqa: E402

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
# the page is drawn: the runs table has its rows / the chart view has plotted lines, and nothing spins
READY_JS = {
    "runs": "document.querySelectorAll('.ag-row').length > 0",
    "charts": "document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length >= {n_charts}",
    "artifacts": "Array.from(document.querySelectorAll('img')).some(i => i.complete && i.naturalWidth > 300)",
}
NO_SPINNER_JS = "document.querySelectorAll('[class*=spinner], [data-testid*=spinner]').length === 0"
CLOSE_ASSISTANT_JS = (
    "(() => { const b = document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]');"
    " if (b) { b.click(); return true; } return false; })()"
)


class SnapshotError(Exception):
    """A missing tool or store, or a server that does not come up: one line for the user."""


def find_chromium(explicit: str | None = None) -> str:
    if explicit:
        if shutil.which(explicit) or os.path.isfile(explicit):
            return shutil.which(explicit) or explicit
        raise SnapshotError(f"--chromium {explicit}: not found")
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise SnapshotError(
        "Chromium not found (looked for " + ", ".join(CHROMIUM_NAMES) + "); install it, e.g. "
        "`apt-get install -y chromium` on Debian/Ubuntu, or pass --chromium PATH"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SnapshotError(f"the server exited with status {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SnapshotError(f"{url} did not answer within {timeout_s:.0f} s")


def start_mlflow_ui(tracking_uri: str, port: int, log_path: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    log = open(log_path, "w")
    # its own process group: uvicorn's worker goes down with it
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


class Browser:
    """Headless Chromium driven over the DevTools protocol (one page)."""

    def __init__(self, chromium: str, profile: str, width: int, height: int):
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SnapshotError(f"{chromium} did not start (status {self.proc.poll()})")
            time.sleep(0.2)
        port = int(open(port_file).read().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        # entered by hand: websockets >= 17 deprecates using connect()'s result without ``with``
        self._conn = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=30)
        self.ws = self._conn.__enter__()
        self._id = 0
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=height, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise SnapshotError(f"Chromium: {method}: {msg['error'].get('message')}")
                return msg.get("result", {})

    def eval(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    def shoot(self, url: str, path: str, ready_js: str, *, timeout_s: float, settle_s: float = 2.0) -> bool:
        """Open ``url``, wait until ``ready_js`` holds and nothing spins, save a PNG; True when ready."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        ready = False
        while time.monotonic() < deadline:
            self.eval(CLOSE_ASSISTANT_JS)
            if self.eval(f"({ready_js}) && ({NO_SPINNER_JS})"):
                ready = True
                break
            time.sleep(0.5)
        time.sleep(settle_s)  # chart transitions
        self.eval(CLOSE_ASSISTANT_JS)
        time.sleep(0.5)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return ready

    def close(self) -> None:
        try:
            self._conn.__exit__(None, None, None)
        finally:
            stop(self.proc)


def shoot_plain(chromium: str, profile: str, url: str, path: str, width: int, height: int, budget_ms: int):
    """Fallback without ``websockets``: Chromium's own ``--screenshot`` after a virtual-time budget."""
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
         f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=budget_ms / 1000 + 120, check=False,
    )  # fmt: skip
    return os.path.exists(path)


def experiment_id(tracking_uri: str, name: str) -> str:
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking_uri).get_experiment_by_name(name)
    if exp is None:
        raise SnapshotError(f"--experiment {name}: no such MLflow experiment at {tracking_uri}")
    return exp.experiment_id


def snapshot(
    tracking_uri: str,
    experiment: str,
    out_dir: str,
    *,
    width: int = 1400,
    height: int = 900,
    compare_run: str | None = None,
    chromium: str | None = None,
    server_timeout_s: float = 180.0,
    page_timeout_s: float = 90.0,
) -> dict[str, str]:
    """Save the screenshots; returns {view: png path}. Raises :class:`SnapshotError` for a user error."""
    if tracking_uri.startswith("sqlite:///") and not os.path.exists(tracking_uri[len("sqlite:///") :]):
        raise SnapshotError(f"--tracking-uri {tracking_uri}: no MLflow store there (the file does not exist)")
    browser_bin = find_chromium(chromium)
    exp_id = experiment_id(tracking_uri, experiment)
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="muzero_tune_snapshot_")
    port = free_port()
    ui = f"http://127.0.0.1:{port}"
    views = {
        "runs": (experiment_url(exp_id, ui_url=ui, charts=False), READY_JS["runs"]),
        "charts": (experiment_url(exp_id, ui_url=ui), READY_JS["charts"].format(n_charts=2)),
    }
    if compare_run:
        from mlflow.tracking import MlflowClient

        run = MlflowClient(tracking_uri).get_run(compare_run)
        views["compare"] = (
            run_url(
                run.info.experiment_id, compare_run, ui_url=ui, tab="artifacts/plots/reward_vs_envstep.png"
            ),
            READY_JS["artifacts"],
        )
    server = browser = None
    out: dict[str, str] = {}
    try:
        server = start_mlflow_ui(tracking_uri, port, os.path.join(work, "mlflow_ui.log"))
        print(f"[dashboard_snapshot] mlflow ui on {ui} (pid {server.pid}); waiting for it", flush=True)
        t0 = time.monotonic()
        wait_http(f"{ui}/health", server_timeout_s, server)
        print(f"[dashboard_snapshot] up after {time.monotonic() - t0:.1f} s", flush=True)
        try:
            import websockets.sync.client  # noqa: F401

            browser = Browser(browser_bin, os.path.join(work, "profile"), width, height)
        except ImportError:
            browser = None
        for view, (url, ready_js) in views.items():
            path = os.path.join(out_dir, f"mlflow_{view}.png")
            if browser is not None:
                ready = browser.shoot(url, path, ready_js, timeout_s=page_timeout_s)
            else:
                ready = shoot_plain(
                    browser_bin, os.path.join(work, f"profile_{view}"), url, path, width, height, 30000
                )
            note = "" if ready else " (not fully drawn before the timeout)"
            print(f"[dashboard_snapshot] {view}: {url} -> {path}{note}", flush=True)
            out[view] = path
    finally:
        if browser is not None:
            browser.close()
        stop(server)
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", required=True, help="the MLflow store, e.g. sqlite:////abs/mlflow.db")
    p.add_argument("--experiment", required=True, help="the MLflow experiment (= sweep name)")
    p.add_argument("--out", default="docs/img", help="folder for the PNGs (default docs/img)")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--compare-run", default=None, help="also shoot this run's artifacts (a compare run id)")
    p.add_argument("--chromium", default=None, help="the Chromium binary (default: found on PATH)")
    p.add_argument("--server-timeout-s", type=float, default=180.0)
    args = p.parse_args(argv)
    try:
        snapshot(
            args.tracking_uri, args.experiment, args.out, width=args.width, height=args.height,
            compare_run=args.compare_run, chromium=args.chromium, server_timeout_s=args.server_timeout_s,
        )  # fmt: skip
    except SnapshotError as e:
        print(f"dashboard_snapshot: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
