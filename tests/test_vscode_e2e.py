"""The VS Code extension, for real: typecheck + unit tests, and the user story end to end.

The end-to-end tests install the built `htam.vsix` into code-server (VS Code in a
browser), drive it with Playwright in Debian's Chromium against the real `htam-lsp`,
and save screenshots to test-artifacts/vscode/. `bash editors/vscode/scripts/setup.sh`
installs everything they need; when one of its steps failed they skip naming it (in CI they fail).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers.skips import require

if TYPE_CHECKING:
    from playwright.sync_api import Frame, Locator, Page

REPO = Path(__file__).resolve().parents[1]
EXTENSION = REPO / "editors" / "vscode"
TOOLS = REPO / ".tools"
SETUP_FAILED = TOOLS / "vscode-setup-failed"
NODE_BIN = TOOLS / "node" / "node_modules" / "node" / "bin"
CODE_SERVER = TOOLS / "code-server" / "node_modules" / ".bin" / "code-server"
VSIX = EXTENSION / "htam.vsix"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "vscode"
SCREENSHOTS = REPO / "docs" / "screenshots"
EXAMPLE = REPO / "examples" / "softmax"
KERNEL_FILE = "cpu_naive.py"
CUDA_FILE = "cuda_naive.py"
IDLE = r"HTAM: idle( \(.+\))?$"
KERNEL_NAME = "softmax_forward"
SETUP = "bash editors/vscode/scripts/setup.sh"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USER_SETTINGS = {
    "htam.provider": "offline",
    "htam.device": "cpu",
    "workbench.startupEditor": "none",
    "workbench.secondarySideBar.defaultVisibility": "hidden",
    "chat.disableAIFeatures": True,
    "security.workspace.trust.startupPrompt": "never",
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "telemetry.telemetryLevel": "off",
    "editor.hover.delay": 100,
    # On a busy 2-core machine a real win may measure under the 1.10x default; 1.0 still
    # keeps every slowdown out of the light bulb.
    "htam.minSpeedup": 1.0,
}
STARTUP_S = 60
BARE = "bare-python"  # the `vscode` fixture's parameter: start with a Python without htam
STEP_TIMEOUT_S = 300
WIN_ATTEMPTS = 3  # steps to find one measured win on a loaded machine


def _tool_env() -> dict[str, str]:
    """PATH with this interpreter's bin (htam-lsp, python3) and Node 24 first."""
    path = os.pathsep.join([str(Path(sys.executable).parent), str(NODE_BIN), os.environ["PATH"]])
    return {**os.environ, "PATH": path}


def _setup_problem() -> str | None:
    """Why the end-to-end test cannot run here, or None."""
    if SETUP_FAILED.exists():
        return f"VS Code setup failed: {SETUP_FAILED.read_text().strip()} (rerun `{SETUP}`)"
    for what, path in (("code-server", CODE_SERVER), ("htam.vsix", VSIX), ("Chromium", CHROMIUM)):
        if not path.exists():
            return f"{what} is not installed ({path}): run `{SETUP}`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]'"
    return None


# --- the extension's own checks ------------------------------------------------------------


def test_extension_typechecks_and_unit_tests_pass() -> None:
    missing = not (EXTENSION / "node_modules").is_dir() or not shutil.which("npm")
    require(f"npm or the extension's npm packages are missing: run `{SETUP}`" if missing else None)
    for script in ("typecheck", "lint", "test"):
        done = subprocess.run(
            ["npm", "run", "--silent", script],
            cwd=EXTENSION,
            env=_tool_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm run {script}:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"^\S+ pass [1-9]", done.stdout, re.MULTILINE), done.stdout


# --- a VS Code session ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@dataclass
class VSCode:
    """A code-server window on a folder holding a copy of the softmax example."""

    page: Page
    folder: Path
    htam_home: Path
    user_data: Path
    name: str
    shots: list[Path] = field(default_factory=list)

    @property
    def kernel(self) -> Path:
        return self.folder / KERNEL_FILE

    def shot(self, moment: str, keep: str | None = None) -> None:
        """A screenshot in test-artifacts/; `keep`: also as docs/screenshots/KEEP.png."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}-{len(self.shots) + 1:02d}-{moment}.png"
        self.page.screenshot(path=str(path))
        self.shots.append(path)
        if keep:
            shutil.copy(path, SCREENSHOTS / f"{keep}.png")

    def status(self) -> str:
        item = self.page.locator(".statusbar-item", has_text="HTAM:")
        return str(item.first.inner_text()) if item.count() else ""

    def wait_status(self, pattern: str, timeout_s: float) -> str:
        """Waits until the HTAM status bar item matches `pattern`; returns its text."""
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, text := self.status()):
            if time.monotonic() > deadline:
                self.shot("timeout")
                raise AssertionError(f"status bar {text!r} never matched {pattern!r}")
            time.sleep(0.5)
        return text

    def palette(self, title: str) -> None:
        page = self.page
        page.keyboard.press("F1")
        box = page.locator(".quick-input-widget input")
        box.wait_for(state="visible")
        box.fill(f">{title}")
        row = page.locator(".quick-input-list .monaco-list-row", has_text=title)
        row.first.wait_for(state="visible")
        page.keyboard.press("Enter")

    def open_kernel(self, name: str = KERNEL_FILE) -> None:
        page = self.page
        page.keyboard.press("Control+P")
        box = page.locator(".quick-input-widget input")
        box.wait_for(state="visible")
        box.fill(name)
        page.locator(".quick-input-list .monaco-list-row", has_text=name).first.wait_for()
        page.keyboard.press("Enter")
        page.locator(".tab.active", has_text=name).wait_for()
        self.focus_editor()

    def focus_editor(self) -> None:
        """Clicks into the visible editor (a hidden one may come first in the page)."""
        self.page.locator(".monaco-editor .view-lines").filter(visible=True).first.click()

    def go_to_kernel(self) -> None:
        """Puts the cursor on the C++ kernel's name (the server's unit under the cursor)."""
        lines = self.kernel.read_text().splitlines()
        line = next(i for i, text in enumerate(lines, 1) if f"void {KERNEL_NAME}(" in text)
        self.page.keyboard.press("Control+G")
        self.page.keyboard.type(f"{line}:{lines[line - 1].index(KERNEL_NAME) + 2}")
        self.page.keyboard.press("Enter")

    def light_bulb_row(self, text: str, timeout_s: float = 120) -> Locator:
        """The light bulb's row naming `text` (Ctrl+.), asked again as a user would when
        the list opened before the server answered (2 cores, the server just started and
        its warm judge importing torch beside it)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        row = self.page.locator(".action-widget .monaco-list-row", has_text=text)
        deadline = time.monotonic() + timeout_s
        while not row.count():
            if time.monotonic() > deadline:
                self.shot("no-light-bulb-row")
                raise AssertionError(f"no light bulb row {text!r}")
            self.page.keyboard.press("Escape")
            self.page.keyboard.press("Control+.")
            with contextlib.suppress(PlaywrightTimeout):
                row.first.wait_for(timeout=15_000)
        return row.first

    def hover_text(self) -> str:
        """Shows the hover at the cursor (Ctrl+K Ctrl+I) and returns its text."""
        page = self.page
        hover = page.locator(".monaco-hover:visible", has_text="HTAM")
        deadline = time.monotonic() + 30
        while not hover.count():
            if time.monotonic() > deadline:
                raise AssertionError("no HTAM hover appeared")
            page.keyboard.press("Control+K")
            page.keyboard.press("Control+I")
            time.sleep(1)
        return str(hover.first.inner_text())

    def wait_lens(self, text: str) -> None:
        """Waits for a visible code lens naming `text`. A lens of an editor hidden behind
        the active one stays in the page (hidden), and may come first."""
        lenses = self.page.locator(".codelens-decoration", has_text=text)
        lenses.filter(visible=True).first.wait_for()

    def wait_preview(self, text: str) -> None:
        """Waits until the HTAM view (a webview frame) shows `text`."""
        deadline = time.monotonic() + 30
        while not any(self._frame_has(frame, text) for frame in self.page.frames):
            if time.monotonic() > deadline:
                raise AssertionError(f"no preview showed {text!r}")
            time.sleep(0.5)

    def preview_image_width(self, alt: str) -> int:
        """The natural width of the image `alt` once the HTAM view has loaded it."""
        from playwright.sync_api import Error

        script = (
            "alt => { const img = [...document.images].find(i => i.alt === alt);"
            " return img && img.complete ? img.naturalWidth : -1; }"
        )
        deadline = time.monotonic() + 30
        while True:
            for frame in self.page.frames:
                try:
                    width = int(frame.evaluate(script, alt))
                except Error:
                    continue  # a frame still loading or already gone
                if width > 0:
                    return width
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.5)

    @staticmethod
    def _frame_has(frame: Frame, text: str) -> bool:
        from playwright.sync_api import Error

        try:
            return text in frame.inner_text("body", timeout=1000)
        except Error:
            return False  # a frame still loading or already gone

    def notifications(self) -> str:
        toasts = self.page.locator(".notifications-toasts .notification-toast")
        return "\n".join(toasts.all_inner_texts())

    def htam_log(self) -> str:
        logs = self.user_data / "logs"
        return "\n".join(p.read_text(errors="replace") for p in logs.rglob("*HTAM*.log"))


def _write_settings(user_data: Path, interpreter: str) -> None:
    """User settings, and the interpreter as a machine setting (code-server's extension
    host is remote: it reads machine-scoped settings there). It is named because the
    extension host takes PATH from a login shell, not from whoever started code-server."""
    for scope, values in (
        ("User", USER_SETTINGS),
        ("Machine", {"htam.interpreter": interpreter}),
    ):
        settings = user_data / scope / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values, indent=2))


def _install_extension(env: dict[str, str], user_data: Path, extensions: Path) -> None:
    done = subprocess.run(
        [str(CODE_SERVER), "--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
        + ["--install-extension", str(VSIX)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "successfully installed" in done.stdout, (
        done.stdout + done.stderr
    )


@pytest.fixture
def vscode(tmp_path: Path, htam_home: Path, request: pytest.FixtureRequest) -> Iterator[VSCode]:
    require(_setup_problem())
    from playwright.sync_api import sync_playwright

    for old in ARTIFACTS.glob(f"{request.node.name}-*"):
        old.unlink()
    folder = tmp_path / "workspace"
    folder.mkdir()
    for name in (KERNEL_FILE, CUDA_FILE, "reference.py"):
        shutil.copy(EXAMPLE / name, folder / name)
    # Built at -O0, the kernel has a win (-O3) big enough to measure on a loaded machine.
    kernel = folder / KERNEL_FILE
    kernel.write_text(kernel.read_text().replace('extra_cflags=["-O2"]', 'extra_cflags=["-O0"]'))
    user_data, extensions = tmp_path / "user-data", tmp_path / "ext"
    env = {**_tool_env(), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    interpreter = sys.executable
    if getattr(request, "param", None) == BARE:  # a Python without htam, as on a first start
        bare = tmp_path / "bare-venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
        interpreter = str(bare / "bin" / "python")
    _write_settings(user_data, interpreter)
    _install_extension(env, user_data, extensions)
    port = _free_port()
    with (tmp_path / "code-server.log").open("w") as log:
        server = subprocess.Popen(
            [str(CODE_SERVER), "--auth", "none", "--bind-addr", f"127.0.0.1:{port}"]
            + ["--user-data-dir", str(user_data), "--extensions-dir", str(extensions)]
            + ["--disable-telemetry", "--disable-update-check", str(folder)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    session: VSCode | None = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", STARTUP_S)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.set_default_timeout(STARTUP_S * 1000)
            page.goto(f"http://127.0.0.1:{port}/?folder={folder}")
            page.locator(".monaco-workbench").wait_for()
            session = VSCode(page, folder, htam_home, user_data, request.node.name)
            try:
                yield session
            finally:
                session.shot("end")
                browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        if session is not None:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / f"{session.name}-htam.log").write_text(session.htam_log())
        shutil.copy(
            tmp_path / "code-server.log", ARTIFACTS / f"{request.node.name}-code-server.log"
        )


# --- the user story ------------------------------------------------------------------------


def _recorded_sources(htam_home: Path) -> list[str]:
    """Every candidate source the server recorded for the kernel (its verified history)."""
    from htam_engine.memory import MemoryStore
    from htam_lsp.suggestions import NAMESPACE, StepRecord

    store = MemoryStore(home=htam_home)
    records = [
        StepRecord.from_json(raw)
        for _key, value in store.items(NAMESPACE)
        for raw in (value or {}).get("history", [])
    ]
    return [r.step.source for r in records if r is not None and r.step.source]


@pytest.mark.slow
def test_untrusted_folder_parses_and_hovers_but_executes_nothing(vscode: VSCode) -> None:
    original = vscode.kernel.read_text()
    vscode.open_kernel()
    vscode.wait_status(r"idle \(restricted\)", STARTUP_S)
    vscode.wait_lens("Optimize with HTAM")
    vscode.shot("restricted-mode")
    vscode.go_to_kernel()
    assert "HTAM" in vscode.hover_text()
    vscode.palette("HTAM: Explain Kernel")
    vscode.wait_preview(f"HTAM: {KERNEL_NAME}")
    vscode.palette("HTAM: Show Memory")
    vscode.wait_preview("HTAM memory")
    vscode.shot("memory")
    vscode.palette("View: Close All Editors")
    vscode.open_kernel()
    vscode.go_to_kernel()
    vscode.palette("HTAM: Next Step")
    vscode.wait_status("HTAM: refused", 60)
    vscode.page.locator(".notification-toast", has_text="not allowed").first.wait_for()
    vscode.shot("refused")
    assert "trust" in vscode.notifications().lower()
    assert vscode.kernel.read_text() == original
    assert not (vscode.htam_home / "lsp-runs").exists(), "a job ran in an untrusted folder"
    assert not (vscode.htam_home / "lsp-buffers").exists(), "a job started in an untrusted folder"


def _server_environments(htam_home: Path) -> list[dict[str, str]]:
    """The environments of this session's running htam-lsp processes (Linux /proc)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"htam_lsp.server" not in (proc / "cmdline").read_bytes():
                continue
            raw = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        env = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)
        if env.get("HTAM_HOME") == str(htam_home):
            found.append(env)
    return found


@pytest.mark.slow
def test_api_key_from_secret_storage_reaches_the_server_not_settings(vscode: VSCode) -> None:
    key = f"sk-htam-e2e-{os.getpid()}"
    vscode.open_kernel()
    vscode.wait_status("idle", STARTUP_S)
    vscode.palette("HTAM: Set API Key")
    vscode.page.locator(".quick-input-list .monaco-list-row", has_text="anthropic").first.wait_for()
    vscode.page.keyboard.type("anthropic")
    vscode.page.keyboard.press("Enter")
    vscode.page.locator(".quick-input-widget", has_text="ANTHROPIC_API_KEY").wait_for()
    vscode.page.keyboard.type(key)
    vscode.page.keyboard.press("Enter")
    deadline = time.monotonic() + STARTUP_S
    while not any(
        env.get("ANTHROPIC_API_KEY") == key for env in _server_environments(vscode.htam_home)
    ):
        if time.monotonic() > deadline:
            raise AssertionError("the restarted htam-lsp did not get the stored key")
        time.sleep(0.5)
    vscode.shot("key-stored")
    settings = [*vscode.user_data.rglob("settings.json"), *vscode.folder.rglob("settings.json")]
    assert settings, "no settings.json to check"
    assert all(key not in path.read_text() for path in settings), "the key leaked into settings"


@pytest.mark.slow
def test_trusted_folder_next_step_light_bulb_and_hover(vscode: VSCode) -> None:
    original = vscode.kernel.read_text()
    vscode.open_kernel()
    vscode.wait_status(r"idle \(restricted\)", STARTUP_S)
    _trust_workspace(vscode)
    vscode.wait_status(IDLE, STARTUP_S)
    for attempt in range(1, WIN_ATTEMPTS + 1):
        if _step_found_a_win(vscode, attempt):
            break
    else:
        raise AssertionError(f"{WIN_ATTEMPTS} steps found nothing faster\n{vscode.htam_log()}")
    # One notification for the step, in the server's words, offering the actions (checked
    # at once: a toast hides itself after a while, and the results view takes a while).
    vscode.page.locator(".notification-toast", has_text="faster than your code").first.wait_for()
    assert "Show Actions" in vscode.notifications()
    # The results view: the trajectory and the engine's speedup plot, in the HTAM view.
    vscode.go_to_kernel()
    vscode.palette("HTAM: Show Results")
    vscode.wait_preview("HTAM results")
    assert vscode.preview_image_width("speedup per step") > 0, "the plot did not render"
    vscode.shot("results-plot", keep="vscode-results-plot")
    vscode.palette("View: Close All Editors")
    vscode.open_kernel()

    # An edit elsewhere in the file (a comment on line 1) keeps the suggestion.
    note = "# a note written while HTAM ran\n"
    vscode.page.keyboard.press("Control+Home")
    vscode.page.keyboard.type(note)
    vscode.page.keyboard.press("Control+S")
    deadline = time.monotonic() + 30
    while not vscode.kernel.read_text().startswith(note) and time.monotonic() < deadline:
        time.sleep(0.5)
    edited = vscode.kernel.read_text()
    assert edited == note + original

    vscode.go_to_kernel()
    hover = vscode.hover_text()
    vscode.shot("hover")
    for heading in ("Last step", "Transition evidence", "Measured history"):
        assert heading in hover, hover

    vscode.go_to_kernel()
    action = vscode.light_bulb_row("HTAM: apply")
    title = str(action.inner_text())
    vscode.shot("light-bulb")
    direction = re.search(r"HTAM: apply (.+?) -> ", title)
    assert direction, title
    assert direction.group(1) in hover, f"hover does not explain {direction.group(1)!r}"
    gains = [float(g) for g in re.findall(r"(\d+\.\d+)x faster", title)]
    assert gains and min(gains) >= 1.0, f"a slowdown was offered: {title}"
    low = re.search(r"faster \(95 % (\d+\.\d+)-\d+\.\d+\)", title)
    assert low and float(low.group(1)) >= 1.0, f"no interval, or its lower bound is low: {title}"
    # Ctrl+Enter on the focused action opens VS Code's refactor preview with the diff.
    vscode.page.keyboard.press("Control+Enter")
    apply = vscode.page.get_by_role("button", name="Apply", exact=True)
    apply.first.wait_for()
    vscode.shot("diff-preview")
    apply.first.click()
    vscode.page.keyboard.press("Control+S")
    deadline = time.monotonic() + 30
    while vscode.kernel.read_text() == edited and time.monotonic() < deadline:
        time.sleep(0.5)
    vscode.shot("applied")
    changed = vscode.kernel.read_text()
    assert changed.startswith(note), "the edit elsewhere was lost"
    candidate = changed.removeprefix(note)
    assert candidate != original, "accepting the HTAM action did not change the file"
    assert candidate in _recorded_sources(vscode.htam_home), "the file is not a verified candidate"

    vscode.go_to_kernel()
    vscode.palette("HTAM: Optimize (N steps)")
    vscode.page.locator(".quick-input-widget", has_text="How many steps").wait_for()
    vscode.page.keyboard.press("Control+A")
    vscode.page.keyboard.type("3")
    vscode.page.keyboard.press("Enter")
    vscode.wait_status(r"measuring|step \d+ of 3", 60)
    cancel = vscode.page.locator(".notification-toast", has_text="HTAM").get_by_role(
        "button", name="Cancel"
    )
    cancel.first.click()
    vscode.wait_status("HTAM: cancelled", 60)
    vscode.shot("cancelled")
    assert vscode.kernel.read_text() == changed


@pytest.mark.slow
def test_cuda_without_gpu_is_refused_with_the_reason_and_a_reference_gets_nothing(
    vscode: VSCode,
) -> None:
    """htam.device is cpu in these sessions: a CUDA kernel cannot run, GPU or not."""
    vscode.open_kernel()
    vscode.wait_status(r"idle \(restricted\)", STARTUP_S)
    _trust_workspace(vscode)
    vscode.wait_status(IDLE, STARTUP_S)
    vscode.palette("View: Close All Editors")
    vscode.open_kernel("reference.py")
    time.sleep(3)  # time enough for a lens to appear, if the server sent one
    vscode.shot("reference-gets-nothing")
    assert not vscode.page.locator(".codelens-decoration", has_text="HTAM").count()
    vscode.open_kernel(CUDA_FILE)
    vscode.wait_lens("Optimize with HTAM")
    started = time.monotonic()
    vscode.palette("HTAM: Next Step")
    vscode.wait_status("HTAM: refused", 30)
    toast = vscode.page.locator(".notification-toast", has_text="needs an NVIDIA GPU")
    toast.first.wait_for()
    time.sleep(1)  # the toast slides in
    toast.first.hover()
    expand = toast.first.locator(".codicon-notifications-expand")
    if expand.count():  # show the whole reason in the screenshot
        expand.first.click()
    vscode.shot("cuda-refused")
    assert time.monotonic() - started < 20, "the refusal took as long as a run"
    assert "nvcc" in vscode.notifications()
    assert not (vscode.htam_home / "lsp-runs").exists(), "a job ran without a GPU"


@pytest.mark.slow
@pytest.mark.parametrize("vscode", [BARE], indirect=True)
def test_a_first_start_without_htam_says_so_and_choosing_an_interpreter_starts_the_server(
    vscode: VSCode,
) -> None:
    """htam.interpreter is a Python without htam: the user reads why, in one line, with
    the interpreter pick and "Install htam Here"; picking a Python that has htam starts it."""
    vscode.open_kernel()
    toast = vscode.page.locator(".notification-toast", has_text="htam-lsp cannot be started")
    toast.first.wait_for()
    vscode.wait_status("HTAM: not running", 30)
    time.sleep(1)  # the toast slides in
    said = vscode.notifications()
    assert "No module named 'htam_lsp'" in said, said
    assert "Traceback" not in said and not re.search(r"^\s*at \S+", said, re.MULTILINE), said
    for button in ("Choose Interpreter", "Install htam Here"):
        assert toast.first.get_by_role("button", name=button).count(), f"no {button}: {said}"
    vscode.shot("no-htam", keep="vscode-onboarding-no-htam")

    toast.first.get_by_role("button", name="Choose Interpreter").click()
    rows = vscode.page.locator(".quick-input-list .monaco-list-row")
    rows.filter(has_text="Enter interpreter path").first.wait_for()
    listed = rows.all_inner_texts()
    assert any("bare-venv" in row and "htam_lsp" in row for row in listed), listed
    vscode.shot("interpreter-pick", keep="vscode-onboarding-interpreter-pick")
    vscode.page.keyboard.type("Enter interpreter path")
    vscode.page.keyboard.press("Enter")
    vscode.page.locator(".quick-input-widget", has_text="has htam installed").wait_for()
    box = vscode.page.locator(".quick-input-widget input")
    box.fill(sys.executable)  # the box, not the editor, whichever holds the focus
    box.press("Enter")
    vscode.wait_status(r"idle \(restricted\)", STARTUP_S)
    vscode.wait_lens("Optimize with HTAM")
    vscode.shot("server-started", keep="vscode-onboarding-server-started")
    assert f"Interpreter: {sys.executable} (from the htam.interpreter setting)" in vscode.htam_log()


def _step_found_a_win(vscode: VSCode, attempt: int) -> bool:
    """Runs one step; True when it offers a win. A step on this busy machine may measure
    a slowdown: then nothing may be offered (the light bulb has no apply action)."""
    vscode.go_to_kernel()
    vscode.palette("HTAM: Next Step")
    vscode.wait_status(r"measuring|step \d+ of 1|queued", 60)
    vscode.shot(f"running-{attempt}")
    finished = vscode.wait_status(r"HTAM: (\d+\.\d+x|nothing to apply|failed)", STEP_TIMEOUT_S)
    vscode.shot(f"step-finished-{attempt}")
    assert "failed" not in finished, vscode.htam_log()
    if re.search(r"\d+\.\d+x", finished):
        return True
    vscode.go_to_kernel()
    vscode.page.keyboard.press("Control+.")
    vscode.page.locator(".action-widget .monaco-list-row").first.wait_for()
    rows = vscode.page.locator(".action-widget .monaco-list-row").all_inner_texts()
    assert not any("HTAM: apply" in row for row in rows), f"a non-win was offered: {rows}"
    vscode.page.keyboard.press("Escape")
    return False


def _trust_workspace(vscode: VSCode) -> None:
    """Grants Workspace Trust the way a user does: Manage Workspace Trust, then Trust."""
    vscode.palette("Workspaces: Manage Workspace Trust")
    trust_editor = vscode.page.locator(".workspace-trust-editor")
    button = trust_editor.get_by_role("button", name="Trust", exact=True)
    button.wait_for()
    vscode.shot("trust-editor")
    button.click()
    time.sleep(2)
    vscode.shot("trusted")
    vscode.palette("View: Close All Editors")
    trust_editor.wait_for(state="hidden")
    vscode.open_kernel()


@pytest.mark.slow
def test_compile_check_blames_your_line_and_an_interpreter_change_is_one_plain_message(
    vscode: VSCode,
) -> None:
    """Issue 29 in the real editor: the compile check from the light bulb runs with no LSP
    error toast (codeAction/resolve), names the user's file and line in nvcc's words, and
    leaves no "running (cancel)" lens; then htam.interpreter changed to a Python that does
    not exist, while the server runs, gives one message without a stack trace, whose
    advice pip-installs into a Python that exists."""
    require("nvcc is not on PATH" if shutil.which("nvcc") is None else None)
    cuda = vscode.folder / CUDA_FILE
    cuda.write_text(cuda.read_text().replace("m = fmaxf(m, xr[c]);", "m = fmaxf(m, xr[c])"))
    vscode.open_kernel()
    vscode.wait_status(r"idle \(restricted\)", STARTUP_S)
    _trust_workspace(vscode)
    vscode.wait_status(IDLE, STARTUP_S)
    vscode.open_kernel(CUDA_FILE)
    vscode.wait_lens("Optimize with HTAM")
    # Requests sent to the server that trust restarted are logged, not a stack-trace toast.
    assert "Starting server failed" not in vscode.notifications(), vscode.notifications()
    line = next(i for i, text in enumerate(cuda.read_text().splitlines(), 1) if "fmaxf" in text)
    vscode.page.keyboard.press("Control+G")
    vscode.page.keyboard.type(f"{line}:10")
    vscode.page.keyboard.press("Enter")
    row = vscode.light_bulb_row("compile-check")
    vscode.shot("compile-check-offered")
    row.click()
    toast = vscode.page.locator(".notification-toast", has_text="does not compile with nvcc")
    toast.first.wait_for(timeout=180_000)
    time.sleep(2)  # a resolve error would be a toast of its own by now
    said = vscode.notifications()
    vscode.shot("compile-check-failed")
    assert "-32602" not in said and "not open in the editor" not in said, said
    assert re.search(
        rf'{CUDA_FILE} line \d+ does not compile with nvcc: error: expected a ";"', said
    )
    assert "kernel.cu" not in said and "htam-" not in said, said
    deadline = time.monotonic() + 15  # the server asked VS Code to refresh its lenses
    while vscode.page.locator(".codelens-decoration", has_text="(cancel)").count():
        assert time.monotonic() < deadline, "a stale running lens after the check ended"
        time.sleep(0.5)
    vscode.page.keyboard.press("Control+Shift+M")  # the Problems view
    problem = vscode.page.locator(".markers-panel", has_text="nvcc rejects this line")
    problem.first.wait_for()
    vscode.shot("compile-check-problem", keep="vscode-compile-check-problem")

    # The explanation opens beside the kernel, which keeps the focus: typing edits it.
    vscode.page.keyboard.press("Control+Shift+M")  # the Problems view closes again
    vscode.focus_editor()
    vscode.palette("HTAM: Explain Kernel")
    vscode.wait_preview("HTAM:")
    time.sleep(2)  # a preview that takes the focus has taken it by now
    vscode.page.keyboard.type("# focus stayed here\n")
    vscode.page.locator(".view-lines", has_text="# focus stayed here").first.wait_for(
        timeout=10_000
    )
    vscode.shot("explain-beside-kernel-keeps-focus", keep="vscode-explain-keeps-focus")
    vscode.page.keyboard.press("Control+Z")

    vscode.palette("Notifications: Clear All Notifications")
    missing = vscode.folder / "no-such-venv" / "bin" / "python3"
    settings = vscode.user_data / "Machine" / "settings.json"
    settings.write_text(json.dumps({"htam.interpreter": str(missing)}, indent=2))
    toast = vscode.page.locator(".notification-toast", has_text="htam-lsp cannot be started")
    toast.first.wait_for()
    time.sleep(2)  # any other toast of the change is up by now
    said = vscode.notifications()
    vscode.shot("interpreter-changed", keep="vscode-interpreter-changed")
    assert "Sending notification" not in said and "Starting server failed" not in said, said
    assert not re.search(r"^\s*at \S+", said, re.MULTILINE), said
    assert f"{missing} -m pip" not in said and " -m pip install -e <path-to-htam>" in said, said
