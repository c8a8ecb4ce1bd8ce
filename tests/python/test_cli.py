# SPDX-License-Identifier: Apache-2.0
"""The `attnkit` command line: usage and input errors are one line on stderr with exit code 2,
reported before any work; `attnkit topk` writes what attnkit.topk returns."""

from __future__ import annotations

import errno
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest

import attnkit
from attnkit import _demo, cli
from conftest import assert_same_result, make_rows, rng_for


@pytest.fixture
def restore_threads():
    before = attnkit.num_threads()
    yield
    attnkit.set_num_threads(before)


@pytest.mark.parametrize("argv, fragment", [
    (["demo", "--quick", "--threads", "5000"], "--threads 5000: must be in [1, 4096]"),
    (["demo", "--quick", "--seed", "-1"], "--seed -1: must be in [0, 2^32)"),
    (["demo", "--quick", "--repeats", "0"], "--repeats 0: must be >= 1"),
    (["demo", "--quick", "--json", ""], "--json '': empty path"),
    (["demo", "--quick", "--json", "x" * 300 + ".json"], "File name too long"),
    (["topk", "-k", "abc", "-i", "x.npy", "-o", "o.npz"], "invalid int value: 'abc'"),
    (["topk", "-k", "3", "-i", "x.npy"], "the following arguments are required: --output"),
    (["demo", "--quick", "--warmup", "-3"], "--warmup -3: must be >= 0"),
    (["demo", "--quick", "--cases", ","], "--cases ',': no pattern given"),
    (["demo", "--quick", "--cases", ""], "--cases '': no pattern given"),
    (["demo", "--quick", "--cases", "no-such-case"], "no case matches 'no-such-case'"),
    (["demo", "--quick", "--json", "/nonexistent-folder/out.json"], "does not exist"),
])
def test_demo_usage_errors(argv, fragment, capsys, restore_threads):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors exit from parse_args
        code = e.code
    assert code == 2
    out, err = capsys.readouterr()
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err
    assert "checks:" not in out  # refused before any case ran


def test_no_command_is_a_usage_error_that_names_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "attnkit: error: a command is required: demo, topk or info (see attnkit --help)\n"


def test_demo_json_folder_is_refused_before_the_run(tmp_path, capsys):
    assert cli.main(["demo", "--quick", "--json", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "is a directory" in err and "checks:" not in out  # no case ran


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnkit {attnkit.__version__}"


def test_demo_json_records_the_simd_numpy_dispatches_to(tmp_path, capsys):
    path = tmp_path / "demo.json"
    assert cli.main(["demo", "--quick", "--cases", "sample-k50-issue", "--no-progress",
                     "--device", "cpu", "--json", str(path)]) == 0
    simd = json.loads(path.read_text())["machine"]["numpy_simd"]
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as features
    assert all(features[name] for name in simd), simd
    assert ("AVX2" in simd) == bool(features.get("AVX2")), simd


def test_topk_command_writes_the_op_result(tmp_path, capsys):
    x = make_rows("normal@1", (3, 200), "float32", rng_for("cli_topk"))
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "top.npz"
    assert cli.main(["topk", "--input", str(tmp_path / "x.npy"), "-k", "7", "--sorted", "value",
                     "--output", str(out)]) == 0
    got = np.load(out)
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 7, sorted="value"),
                       "attnkit topk command")


@pytest.mark.parametrize("fill", ("-inf", "-1e3", "-2.5", "7"))
def test_topk_command_takes_negative_value_fills(tmp_path, fill):
    # argparse alone takes -inf and -1e3 for options; the padding slots get the number.
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.npz"
    argv = ["topk", "-i", str(tmp_path / "x.npy"), "-k", "6", "--value-fill", fill, "-o",
            str(out)]
    assert cli.main(argv) == 0
    got = np.load(out)
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 6, value_fill=float(fill)),
                       f"--value-fill {fill}")
    assert (got["values"][:, 5] == np.float32(fill)).all()


def test_topk_command_value_fill_still_needs_a_number(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    with pytest.raises(SystemExit) as info:
        cli.main(["topk", "-i", str(tmp_path / "x.npy"), "-k", "3", "--value-fill", "--no-values",
                  "-o", str(tmp_path / "o.npz")])
    assert info.value.code == 2
    assert "argument --value-fill: expected one argument" in capsys.readouterr().err
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("k, fragment", [(-1, "-k -1: must be in [0, 2^31 - 1]"),
                                         (2**31, "-k 2147483648: must be in [0, 2^31 - 1]")])
def test_topk_command_refuses_k_out_of_range(tmp_path, k, fragment, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", str(k), "--output",
            str(tmp_path / "o.npz")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "o.npz").exists()


def test_python_dash_m_runs_the_command():
    run = subprocess.run([sys.executable, "-m", "attnkit", "--version"], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0 and run.stdout.strip() == f"attnkit {attnkit.__version__}", run


@pytest.mark.parametrize("args, fragment", [
    (["--input", "x" * 300 + ".npy", "-k", "3", "--output", "o.npz"], "File name too long"),
    (["--input", "", "-k", "3", "--output", "o.npz"], "--input '': empty path"),
    (["--input", "{x}", "-k", "3", "--output", ""], "--output '': empty path"),
    (["--input", "{x}", "-k", "3", "--begin", "b" * 300 + ".npy", "--output", "o.npz"],
     "--begin " + "b" * 300 + ".npy: File name too long"),
])
def test_topk_command_refuses_bad_paths_in_one_line(tmp_path, args, fragment, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    argv = ["topk"] + [a.replace("{x}", str(tmp_path / "x.npy")) for a in args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_topk_command_names_the_file_of_a_bad_row_array(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((4, 5), np.float32))
    np.save(tmp_path / "end.npy", np.array([1, 2], np.int64))
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", "2", "--end",
            str(tmp_path / "end.npy"), "--output", str(tmp_path / "o.npz")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--end {tmp_path / 'end.npy'}: end has shape [2]; expected [B] = [4]" in err, err
    assert not (tmp_path / "o.npz").exists()


def test_topk_command_names_the_flag_of_a_bad_index_fill(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", "7", "--indices-dtype", "int32",
            "--index-fill", "99999999999", "--output", str(tmp_path / "o.npz")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--index-fill 99999999999: does not fit the int32 indices" in err, err
    assert "topk: index_fill" not in err
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("flag", ["--input", "--end"])
@pytest.mark.parametrize("link", [False, True])
def test_topk_command_refuses_an_output_that_is_an_input(tmp_path, flag, link, capsys):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    end = np.array([5, 3], np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "end.npy", end)
    target = tmp_path / ("x.npy" if flag == "--input" else "end.npy")
    out = target
    if link:  # another name of the same file
        out = tmp_path / "alias.npz"
        os.link(target, out)
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", "2", "--end",
            str(tmp_path / "end.npy"), "--output", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--output {out}: is the file of {flag}" in err and err.count("\n") == 1, err
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), x)  # neither input rewritten
    np.testing.assert_array_equal(np.load(tmp_path / "end.npy"), end)


def test_topk_command_refuses_outputs_beyond_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(attnkit._arrays, "physical_memory", lambda: 10 << 20)
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", str(1 << 20), "--output",
            str(tmp_path / "o.npz")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "-k 1048576: asks for outputs of shape [2, 1048576], 24.0 MiB, beyond this " \
           "machine's 10.0 MiB of memory" in err, err
    assert "out_indices" not in err and "out_values" not in err, err  # the CLI has neither
    assert "Traceback" not in err and not (tmp_path / "o.npz").exists()


def test_topk_command_names_the_working_buffers_when_they_do_not_fit(tmp_path, capsys,
                                                                     monkeypatch):
    # The CPU backend's own MemoryError (its working buffers; tests/cpp's out-of-memory test
    # makes it) is reported as it is, not as the outputs' size.
    why = ("out of host memory for the CPU backend's working buffers: 2 x 1024 bytes (k = 3, "
           "N = 5, B = 2); no output was written")

    def out_of_memory(*args, **kwargs):
        raise MemoryError("topk: " + why)

    monkeypatch.setattr(sys.modules["attnkit.topk"], "topk", out_of_memory)
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    argv = ["topk", "--input", str(tmp_path / "x.npy"), "-k", "3", "--output",
            str(tmp_path / "o.npz")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"attnkit topk: error: -k 3: {why}\n", err
    assert not (tmp_path / "o.npz").exists()


def test_a_failed_output_write_leaves_the_earlier_file_whole(tmp_path):
    # A write that fails part way (a size limit standing in for a full disk) leaves the file
    # that was there, and no partial archive or temporary file beside it.
    np.save(tmp_path / "x.npy", np.zeros((2, 10), np.float32))
    (tmp_path / "o.npz").write_bytes(b"earlier")
    main = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); "
            "from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", main, "topk", "-i", "x.npy", "-k", "1000000",
                          "-o", "o.npz"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                         timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr == "attnkit topk: error: --output o.npz: cannot write: File too large\n"
    assert (tmp_path / "o.npz").read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.npz", "x.npy"]


@pytest.mark.parametrize("kind", ["new", "existing", "link", "device"])
def test_output_is_written_whole_through_every_kind_of_path(tmp_path, kind, capsys):
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o.npz"
    if kind == "existing":
        out.write_bytes(b"earlier")
        out.chmod(0o640)
    elif kind == "link":
        (tmp_path / "target.npz").write_bytes(b"earlier")
        out.symlink_to(tmp_path / "target.npz")
    elif kind == "device":
        out = "/dev/null"
    assert cli.main(["topk", "-i", str(tmp_path / "x.npy"), "-k", "3", "-o", str(out)]) == 0
    capsys.readouterr()
    if kind == "device":
        return
    got = np.load(out)
    np.testing.assert_array_equal(got["indices"], attnkit.topk(x, 3).indices)
    if kind == "existing":
        assert out.stat().st_mode & 0o777 == 0o640  # the earlier file's permissions kept
    if kind == "link":
        assert out.is_symlink() and np.load(tmp_path / "target.npz")["indices"].shape == (2, 3)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


@pytest.mark.parametrize("path", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
@pytest.mark.parametrize("stdout", ["pipe", "file"])
def test_an_output_path_naming_stdout_is_written_as_dash(tmp_path, path, stdout):
    # The archive goes where standard output goes, a pipe (whose descriptor link resolves to no
    # path) or a redirected file, and the summary line to stderr, out of the archive.
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    np.save(tmp_path / "x.npy", x)
    argv = [sys.executable, "-m", "attnkit", "topk", "-i", str(tmp_path / "x.npy"), "-k", "4",
            "-o", path]
    if stdout == "pipe":
        run = subprocess.run(argv, capture_output=True, timeout=120)
        archive = run.stdout
    else:
        with open(tmp_path / "out.npz", "wb") as f:
            run = subprocess.run(argv, stdout=f, stderr=subprocess.PIPE, timeout=120)
        archive = (tmp_path / "out.npz").read_bytes()
    assert run.returncode == 0, run.stderr.decode()
    assert run.stderr.decode().startswith("stdout: values float32 [3, 4], indices int64 [3, 4]")
    got = np.load(io.BytesIO(archive))
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 4), f"topk -o {path}")


def test_an_output_path_naming_another_descriptor_writes_into_it(tmp_path):
    # /dev/fd/N of a pipe: written in place, not replaced through a temporary file beside it.
    x = np.arange(30, dtype=np.float32).reshape(3, 10)
    np.save(tmp_path / "x.npy", x)
    r, w = os.pipe()
    with os.fdopen(r, "rb") as reader:
        with os.fdopen(w, "wb") as writer:  # closed once the command is done: the reader ends
            run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i",
                                  str(tmp_path / "x.npy"), "-k", "4", "-o", f"/dev/fd/{w}"],
                                 pass_fds=(writer.fileno(),), capture_output=True, timeout=120)
        archive = reader.read()
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode().startswith(f"/dev/fd/{w}: values float32 [3, 4]")
    got = np.load(io.BytesIO(archive))
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 4), "topk -o /dev/fd/N")


@pytest.mark.parametrize("output", ["-", "/dev/stdout", "x.npy"])
def test_an_output_into_the_input_through_stdout_is_refused(tmp_path, output):
    # `-i x.npy -o /dev/stdout >> x.npy`: stdout is the input's file, whatever the output says.
    np.save(tmp_path / "x.npy", np.arange(20, dtype=np.float32).reshape(2, 10))
    before = (tmp_path / "x.npy").read_bytes()
    with open(tmp_path / "x.npy", "ab") as stdout:
        run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "x.npy", "-k", "3",
                              "-o", output], cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    assert run.returncode == 2 and "is the file of --input" in run.stderr, run.stderr
    assert (tmp_path / "x.npy").read_bytes() == before


def test_an_output_naming_standard_input_is_refused(tmp_path):
    # `-o /dev/stdin < victim`: the file was opened to be read, not written.
    np.save(tmp_path / "x.npy", np.arange(20, dtype=np.float32).reshape(2, 10))
    (tmp_path / "victim").write_bytes(b"keep")
    with open(tmp_path / "victim", "rb") as stdin:
        run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "x.npy", "-k", "3",
                              "-o", "/dev/stdin"], cwd=tmp_path, stdin=stdin,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    assert run.returncode == 2 and "is standard input" in run.stderr, run.stderr
    assert (tmp_path / "victim").read_bytes() == b"keep"


def test_an_output_through_a_link_to_the_descriptor_folder_is_appended(tmp_path):
    # fds -> /proc/self/fd: fds/N names descriptor N, opened here for appending to a file that
    # already holds a line; the archive goes after it, and the file is not replaced.
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "fds").symlink_to("/proc/self/fd")
    log = tmp_path / "log"
    log.write_bytes(b"keepme\n")
    with open(log, "ab") as f:
        run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "x.npy", "-k", "3",
                              "-o", f"fds/{f.fileno()}"], cwd=tmp_path, pass_fds=(f.fileno(),),
                             capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    data = log.read_bytes()
    assert data.startswith(b"keepme\n")
    got = np.load(io.BytesIO(data[len(b"keepme\n"):]))
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 3), "topk -o fds/N")


def test_the_archive_on_stdout_stays_whole_with_stderr_closed(tmp_path):
    # `attnkit topk -o - 2>&-`: the summary line has nowhere to go, and not into the archive.
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    np.save(tmp_path / "x.npy", x)
    run = subprocess.run(f'"{sys.executable}" -m attnkit topk -i x.npy -k 3 -o - 2>&-',
                         shell=True, cwd=tmp_path, stdout=subprocess.PIPE, timeout=120)
    assert run.returncode == 0
    got = np.load(io.BytesIO(run.stdout))
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 3), "stderr closed")
    with zipfile.ZipFile(io.BytesIO(run.stdout)) as archive:
        end = archive.start_dir + sum(len(i.filename) + 46 + len(i.extra) + len(i.comment)
                                      for i in archive.infolist()) + 22
    assert end == len(run.stdout), "bytes after the archive's end"


def test_a_failing_stdout_is_one_line_not_a_traceback():
    # `attnkit info > /dev/full`: the report cannot be written.
    main = "import sys; from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-c", main, "info"], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.startswith("attnkit info: error: No space left on device")
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def test_output_to_a_closed_stdout_is_a_usage_error(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    main = "import sys; from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    run = subprocess.run(f"{sys.executable} -c '{main}' topk -i x.npy -k 3 -o - >&-",
                         shell=True, cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr == "attnkit topk: error: --output -: standard output is closed\n"


@pytest.mark.parametrize("cuda_build, gpu_visible, fragment", [
    (False, False, "no CUDA GPU is visible to torch here"),
    (False, True, "reinstall with ATTNKIT_CUDA=ON"),
    (True, False, "torch with a visible CUDA GPU is needed"),
])
def test_demo_device_cuda_says_what_is_missing(monkeypatch, cuda_build, gpu_visible, fragment):
    # Rebuilding with CUDA is suggested only where a GPU could then run it.
    monkeypatch.setattr(_demo._ext, "cuda_available_in_build", lambda: cuda_build)
    monkeypatch.setattr(_demo, "_torch_for_cuda", lambda: object() if gpu_visible else None)
    with pytest.raises(_demo.DemoUsageError, match=fragment):
        _demo.choose_device("cuda")


def test_demo_into_a_closed_pipe_stops_quietly(tmp_path):
    # `attnkit demo --json r.json | head -1`: the reader leaves after one line; no traceback
    # follows, and the JSON file asked for is still written whole.
    reader = "import sys; sys.stdin.readline()"
    main = "import sys; from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    report = tmp_path / "r.json"
    demo = subprocess.Popen([sys.executable, "-c", main, "demo", "--quick", "--no-progress",
                             "--json", str(report)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "ATTNKIT_NUM_THREADS": "1"})
    head = subprocess.run([sys.executable, "-c", reader], stdin=demo.stdout, timeout=120)
    demo.stdout.close()
    err = demo.stderr.read().decode()
    assert demo.wait(timeout=120) == 141 and head.returncode == 0
    assert "Traceback" not in err and "BrokenPipeError" not in err
    doc = json.loads(report.read_text())
    assert doc["failures"] == 0 and len(doc["cases"]) == len(_demo.select_cases(None, "cpu"))


def _demo_stderr_on_a_terminal(columns: int, *flags: str) -> str:
    """What `attnkit demo --quick` writes to stderr when stderr is a pseudo-terminal whose
    window reports `columns` (0: a terminal nobody sized, 0 x 0, as `script` makes)."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    size = struct.pack("HHHH", 24 if columns else 0, columns, 0, 0)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    demo = subprocess.Popen([sys.executable, "-m", "attnkit", "demo", "--quick", "--cases",
                             "sample-k50-issue", "--repeats", "5", *flags],
                            stdout=subprocess.DEVNULL, stderr=slave,
                            env={**os.environ, "ATTNKIT_NUM_THREADS": "1"})
    os.close(slave)  # the child's copy stays open until it exits
    chunks, deadline = [], time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                if demo.poll() is not None and not select.select([master], [], [], 0.2)[0]:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every copy of the terminal's other end is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        if demo.poll() is None:
            demo.kill()
    err = b"".join(chunks).decode(errors="replace")
    assert demo.wait(timeout=10) == 0, err
    return err


@pytest.mark.parametrize("columns", [0, 120])
def test_demo_draws_its_progress_bar_on_a_terminal(columns):
    # README: "A progress bar shows on a terminal"; tqdm draws nothing on a 0 x 0 one, which is
    # taken as 80 columns, and a bar filling the last column would wrap on some consoles.
    err = _demo_stderr_on_a_terminal(columns)
    bars = [line for line in err.replace("\n", "\r").split("\r") if "attnkit demo:" in line]
    assert bars and any("step" in bar for bar in bars), err
    assert max(len(bar) for bar in bars) < (columns or 80), err
    quiet = _demo_stderr_on_a_terminal(columns, "--no-progress")
    assert "attnkit demo:" not in quiet, quiet


def test_demo_footer_counts_runs_in_the_singular_too(capsys):
    assert cli.main(["demo", "--quick", "--no-progress", "--device", "cpu", "--cases",
                     "dsa-k512", "--repeats", "1", "--warmup", "1"]) == 0
    assert "Median of 1 run after 1 warm-up;" in capsys.readouterr().out
    assert cli.main(["demo", "--quick", "--no-progress", "--device", "cpu", "--cases",
                     "dsa-k512", "--repeats", "3", "--warmup", "0"]) == 0
    assert "Median of 3 runs after 0 warm-ups;" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["-", "/dev/stdout", "the redirected file"])
def test_demo_json_to_stdout_keeps_the_report_apart(tmp_path, target):
    # `attnkit demo --json - > r.json`, also through /dev/stdout or the file's own name: stdout
    # holds the JSON alone, the report goes to stderr.
    report = tmp_path / "r.json"
    path = str(report) if target == "the redirected file" else target
    with open(report, "wb") as f:
        run = subprocess.run([sys.executable, "-m", "attnkit", "demo", "--quick", "--no-progress",
                              "--cases", "dsa-k512", "--json", path], stdout=f,
                             stderr=subprocess.PIPE, timeout=120,
                             env={**os.environ, "ATTNKIT_NUM_THREADS": "1"})
    err = run.stderr.decode()
    assert run.returncode == 0, err
    doc = json.loads(report.read_text())
    assert [c["name"] for c in doc["cases"]] == ["dsa-k512"] and doc["failures"] == 0
    assert "dsa-k512" in err and "checks: 1 of 1 cases match the reference" in err


def _demo_with_a_failing_case(monkeypatch, capsys, json_path: str):
    """`attnkit demo --json json_path` on one case whose run raises: (exit code, out, err)."""
    def fail(*args, **kwargs):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(_demo, "run_cpu_case", fail)
    code = cli.main(["demo", "--quick", "--no-progress", "--device", "cpu", "--cases", "dsa-k512",
                     "--json", json_path])
    return (code, *capsys.readouterr())


def test_demo_json_to_stdout_keeps_error_lines_out_of_it(monkeypatch, capsys):
    # A case that fails is reported on stderr; stdout still holds the JSON alone.
    code, out, err = _demo_with_a_failing_case(monkeypatch, capsys, "-")
    assert code == 1
    doc = json.loads(out)
    assert [c["check"] for c in doc["cases"]] == ["ERROR"] and doc["failures"] == 1
    assert "dsa-k512: ERROR: RuntimeError: planted failure" in err


def _shell(command: str, cwd, **kwargs) -> subprocess.CompletedProcess:
    """Runs `command` in a shell in `cwd`, `attnkit` standing for this interpreter's module."""
    command = command.replace("attnkit ", f"{shlex.quote(sys.executable)} -m attnkit ")
    return subprocess.run(command, shell=True, cwd=cwd, timeout=120, capture_output=True,
                          env={**os.environ, "ATTNKIT_NUM_THREADS": "1"}, **kwargs)


_ONE_CASE = "--quick --cases dsa-k512"


@pytest.mark.parametrize("progress", ["", "--no-progress"])
def test_demo_json_to_stdout_with_stderr_closed(tmp_path, progress):
    # `attnkit demo --json - 2>&-`: the report (and the progress bar) have nowhere to go and
    # are dropped, not written into the JSON.
    run = _shell(f"attnkit demo {_ONE_CASE} {progress} --json - 2>&-", tmp_path)
    assert run.returncode == 0
    assert [c["name"] for c in json.loads(run.stdout)["cases"]] == ["dsa-k512"]


@pytest.mark.parametrize("command", ["demo --cases nope --json -", "topk -i nope.npy -k 2 -o -"])
def test_errors_with_stderr_closed_stay_out_of_stdout(tmp_path, command):
    run = _shell(f"attnkit {command} 2>&-", tmp_path)
    assert run.returncode == 2 and run.stdout == b""


@pytest.mark.parametrize("command", ["demo --quick --json /dev/stdout",
                                     "topk -i x.npy -k 2 -o /dev/stdout"])
def test_stdout_paths_with_stdout_closed_are_named_so(tmp_path, command):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    run = _shell(f"attnkit {command} >&-", tmp_path)
    assert run.returncode == 2
    assert run.stderr.decode().endswith("/dev/stdout: standard output is closed\n")


def test_demo_json_into_a_fifo(tmp_path):
    # The check before the run does not open a FIFO (which would end its reader's input).
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    run = _shell(f"attnkit demo {_ONE_CASE} --no-progress --json p", tmp_path)
    reader.join(timeout=10)
    if reader.is_alive():  # the demo never opened the FIFO: release the reader
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert run.returncode == 0, run.stderr
    assert [c["name"] for c in json.loads(got[0])["cases"]] == ["dsa-k512"]


def test_demo_json_to_a_socket_is_refused_before_the_run(tmp_path):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        run = _shell(f"attnkit demo {_ONE_CASE} --no-progress --json sock", tmp_path)
    assert run.returncode == 2 and b"checks:" not in run.stdout
    assert run.stderr.decode().endswith(
        "--json sock: cannot write: not a file, FIFO or character device\n")


def test_paths_like_stdout_in_folders_are_files(tmp_path):
    # With stdout closed, only this process's descriptor 1 is refused as stdout.
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    os.makedirs(tmp_path / "sub" / "dev")
    run = _shell("attnkit topk -i x.npy -k 2 -o sub/dev/stdout >&-", tmp_path)
    assert run.returncode == 0, run.stderr
    assert np.load(tmp_path / "sub" / "dev" / "stdout")["indices"].tolist() == [[1, 2], [1, 2]]


def test_demo_json_through_a_dangling_link(tmp_path):
    # The link is kept and its target written, as `>` through the link would.
    os.symlink(tmp_path / "target.json", tmp_path / "link")
    run = _shell(f"attnkit demo {_ONE_CASE} --no-progress --json link", tmp_path)
    assert run.returncode == 0, run.stderr
    assert os.path.islink(tmp_path / "link")
    assert json.loads((tmp_path / "target.json").read_text())["failures"] == 0


def test_demo_json_to_a_descriptor_appends(tmp_path):
    # `--json /dev/fd/3 3>> log`: the log keeps what it held, as the descriptor's writes would.
    (tmp_path / "log").write_text("earlier line\n")
    run = _shell(f"attnkit demo {_ONE_CASE} --no-progress --json /dev/fd/3 3>> log", tmp_path)
    assert run.returncode == 0, run.stderr
    first, rest = (tmp_path / "log").read_text().split("\n", 1)
    assert first == "earlier line" and json.loads(rest)["failures"] == 0


def test_demo_json_write_failure_after_a_failed_check_exits_1(monkeypatch, capsys):
    code, out, err = _demo_with_a_failing_case(monkeypatch, capsys, "/dev/full")
    assert code == 1 and "checks: 0 of 1 cases match the reference" in out
    assert err.endswith("attnkit demo: error: --json /dev/full: No space left on device\n")


def test_demo_json_failed_write_keeps_the_earlier_file(tmp_path, monkeypatch, capsys):
    # The JSON is written beside the file and renamed over it once complete: a write that fails
    # leaves the earlier file as it was, and no temporary file.
    report = tmp_path / "r.json"
    report.write_text("earlier\n")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    code = cli.main(["demo", "--quick", "--no-progress", "--device", "cpu", "--cases", "dsa-k512",
                     "--json", str(report)])
    assert code == 2 and report.read_text() == "earlier\n" and os.listdir(tmp_path) == ["r.json"]
    assert capsys.readouterr().err.endswith(f"--json {report}: No space left on device\n")


def test_demo_json_write_failure_keeps_the_report(tmp_path):
    # The JSON cannot be written after the run (a full disk): the table is still printed, then
    # the error.
    run = _shell(f"attnkit demo {_ONE_CASE} --no-progress --json /dev/full", tmp_path)
    assert run.returncode == 2
    assert "checks: 1 of 1 cases match the reference" in run.stdout.decode()
    assert run.stderr.decode().endswith("--json /dev/full: No space left on device\n")


@pytest.mark.parametrize("header", ["{'descr': '<f4', 'fortran_order': False, 'shape': (10**9,), }",
                                    "{'descr': '<f4', 'fortran_order': False, 'shape': (3,"])
def test_topk_names_a_malformed_npy_header(tmp_path, capsys, header):
    # A header whose shape is an expression, or that is cut short: numpy's own message quotes a
    # parser node's address or a token position.
    header = header.ljust(117) + "\n"
    (tmp_path / "x.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little")
                                     + header.encode())
    assert cli.main(["topk", "-i", str(tmp_path / "x.npy"), "-k", "2", "-o",
                     str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert err.endswith("unreadable .npy file: its header is not a literal dict of descr, "
                        "fortran_order and shape\n"), err


@pytest.mark.parametrize("given", ["-i - --end -", "-i /dev/stdin --end -",
                                   "-i - --end /dev/fd/0"])
def test_topk_reads_standard_input_once(tmp_path, given):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    run = _shell(f"attnkit topk {given} -k 2 -o o.npz < x.npy", tmp_path)
    assert run.returncode == 2 and not (tmp_path / "o.npz").exists()
    end = given.split("--end ")[1]
    assert run.stderr.decode().endswith(f"--end {end}: standard input is already read by "
                                        f"--input\n")


def test_demo_list_shows_the_cases_asked_for(capsys):
    assert cli.main(["demo", "--device", "cpu", "--list", "--cases", "sample-k1*,dsa-k512"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["sample-k1", "sample-k1024-issue", "dsa-k512"]
    assert cli.main(["demo", "--device", "cpu", "--list", "--cases", "nope"]) == 2


def test_demo_names_gpu_only_cases_on_the_cpu(capsys):
    assert cli.main(["demo", "--device", "cpu", "--cases", "dsa-prefill-4096*"]) == 2
    assert "no case matches 'dsa-prefill-4096*' on cpu (dsa-prefill-4096" in capsys.readouterr().err


def test_topk_output_to_dev_null_with_stdin_from_dev_null(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    run = _shell("attnkit topk -i x.npy -k 2 -o /dev/null < /dev/null", tmp_path)
    assert run.returncode == 0, run.stderr


def test_topk_output_with_a_second_hard_link_is_written_in_place(tmp_path):
    # Both names then hold the archive, as after `>`; replacing the file would leave the second
    # name with the old contents.
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    (tmp_path / "o.npz").write_bytes(b"old")
    os.link(tmp_path / "o.npz", tmp_path / "other")
    run = _shell("attnkit topk -i x.npy -k 2 -o o.npz", tmp_path)
    assert run.returncode == 0, run.stderr
    assert os.path.samefile(tmp_path / "o.npz", tmp_path / "other")
    assert np.load(tmp_path / "other")["indices"].tolist() == [[1, 2], [1, 2]]


def test_demo_json_into_a_closed_pipe_stops_quietly():
    # `attnkit demo --json - | true`: the reader is gone before the JSON is written; the demo
    # ends with 141 and no error, as with the table on stdout.
    main = "import sys; from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    demo = subprocess.Popen([sys.executable, "-c", main, "demo", "--quick", "--no-progress",
                             "--cases", "dsa-k512", "--json", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "ATTNKIT_NUM_THREADS": "1"})
    demo.stdout.close()
    err = demo.stderr.read().decode()
    assert demo.wait(timeout=120) == 141
    assert "error" not in err and "Traceback" not in err


def test_topk_command_into_a_closed_pipe_stops_quietly(tmp_path):
    # `attnkit topk -o - | head -c 10`: the archive (768 KB) outgrows the pipe's buffer, the
    # reader leaves, and the command ends as the demo does, with 141 and nothing on stderr.
    x = make_rows("normal@1", (64, 4000), "float32", rng_for("cli_closed_pipe"))
    np.save(tmp_path / "x.npy", x)
    main = "import sys; from attnkit import cli; sys.exit(cli.main(sys.argv[1:]))"
    command = subprocess.Popen([sys.executable, "-c", main, "topk", "-i", str(tmp_path / "x.npy"),
                                "-k", "1000", "-o", "-"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run([sys.executable, "-c", "import sys; sys.stdin.buffer.read(10)"],
                          stdin=command.stdout, timeout=120)
    command.stdout.close()
    err = command.stderr.read().decode()
    assert command.wait(timeout=120) == 141 and head.returncode == 0, err
    assert err == "", err


def test_topk_command_reads_its_input_from_a_pipe(tmp_path):
    # A pipe cannot be reopened or rewound: the whole file has to come from one read.
    x = make_rows("normal@1", (4, 50), "float32", rng_for("cli_pipe"))
    buffer = tmp_path / "x.npy"
    np.save(buffer, x)
    out = tmp_path / "top.npz"
    run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "/dev/stdin", "-k", "5",
                          "-o", str(out)], input=buffer.read_bytes(), capture_output=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    got = np.load(out)
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 5), "topk from a pipe")


def test_topk_command_between_pipes_with_dashes(tmp_path):
    # "-i -" reads the array from stdin and "-o -" writes the archive to stdout, with the
    # summary line on stderr so that it stays out of the archive.
    x = make_rows("normal@1", (3, 40), "float32", rng_for("cli_dashes"))
    buffer = tmp_path / "x.npy"
    np.save(buffer, x)
    run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "-", "-k", "6",
                          "--sorted", "value", "-o", "-"], input=buffer.read_bytes(),
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    assert run.stderr.decode().startswith("stdout: values float32 [3, 6], indices int64 [3, 6]")
    got = np.load(io.BytesIO(run.stdout))
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 6, sorted="value"),
                       "topk between pipes")
    assert not (tmp_path / "-").exists() and not os.path.exists("-")


def test_topk_command_reads_no_more_of_a_pipe_than_the_array(tmp_path):
    # The writer keeps the pipe open after the array and more bytes: a reader that waited for
    # the end of the stream would never finish (or, on an endless stream, run out of memory).
    x = make_rows("normal@1", (2, 30), "float32", rng_for("cli_pipe_open"))
    buffer = tmp_path / "x.npy"
    np.save(buffer, x)
    writer = ("import sys, time; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read() + "
              "bytes(1 << 20)); sys.stdout.flush(); time.sleep(300)")
    source = subprocess.Popen([sys.executable, "-c", writer, str(buffer)], stdout=subprocess.PIPE)
    try:
        out = tmp_path / "top.npz"
        run = subprocess.run([sys.executable, "-m", "attnkit", "topk", "-i", "/dev/stdin", "-k",
                              "4", "-o", str(out)], stdin=source.stdout, capture_output=True,
                             timeout=60)
    finally:
        source.kill()
        source.stdout.close()
        source.wait()
    assert run.returncode == 0, run.stderr.decode()
    got = np.load(out)
    assert_same_result((got["values"], got["indices"]), attnkit.topk(x, 4), "topk from a pipe")
