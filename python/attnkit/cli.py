# SPDX-License-Identifier: Apache-2.0
"""The ``attnkit`` command line.

``attnkit demo``  runs the seed top-k workloads, checked against the reference backend and
                  timed beside the usual baselines (CPU, or the GPU when one is usable).
``attnkit topk``  runs top-k on a .npy file and writes values and indices to a .npz file.
``attnkit info``  prints the build information.

Exit codes: 0 success, 1 a demo result that does not match the reference, 2 a usage or input
error (reported in one line, without a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class InputError(Exception):
    """A bad file or argument value: reported in one line, exit code 2."""


# ---------------------------------------------------------------------------------------------
# attnkit topk
# ---------------------------------------------------------------------------------------------

_ROW_DTYPES = ("int32", "int64")


class _Stream(io.RawIOBase):
    """A file written front to back, with no position to ask (tell and seek raise): zipfile
    then writes each member's sizes after its data. A character device (/dev/null) reports
    position 0 after any write, from which zipfile would compute the archive's offsets."""

    def __init__(self, f) -> None:
        super().__init__()
        self._f = f

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._f.write(data)


def _write_archive(path: Path, arrays: dict) -> None:
    """Writes the .npz archive at `path`, the name as given (np.savez would append ".npz"),
    as write_output does."""
    import numpy as np

    write_output(path, lambda f: np.savez(f, **arrays))


def write_output(path, write) -> None:
    """Writes the file at `path` by `write(f)` (f a binary file, maybe without a position)
    through a temporary file beside it, renamed over `path` once complete, so that a failed
    write (a full disk) leaves neither a truncated file nor a damaged earlier one. A path
    that is not a regular file (/dev/null, a FIFO) or that names an open descriptor
    (/dev/stderr, /dev/fd/3, whose file the caller opened to be written, not replaced) is
    written in place, and so is a file with other hard links or in a folder that cannot take
    the temporary file; a file whose mode forbids writing is refused (PermissionError); a
    symbolic link's target is replaced, keeping the link."""
    try:
        st = os.stat(path)
        mode = st.st_mode
    except FileNotFoundError:
        mode = None
    descriptor = _names_descriptor(path)
    if mode is not None and stat.S_ISREG(mode) and not descriptor:
        # A file that its mode keeps from being written is refused, as the shell's `>` would
        # refuse it, rather than replaced; one with other hard links, or in a folder that
        # cannot take the temporary file, is written in place, as `>` would write it.
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        folder = os.path.dirname(os.path.realpath(path))
        in_place = st.st_nlink > 1 or not os.access(folder, os.W_OK | os.X_OK)
    else:
        in_place = False
    if in_place or descriptor or (mode is not None and not stat.S_ISREG(mode)):
        # A descriptor's file is appended to, as its writes would be, not truncated at open
        # (`2>> log` keeps the log).
        with open(path, "ab" if descriptor else "wb") as f:
            write(_Stream(f))
        return
    if mode is None:  # what open() would create: 0o666 less the umask
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, stat.S_IMODE(mode))
            write(f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_DESCRIPTOR_PATH = re.compile(r"/(dev/(fd/|std(out|err)$)|proc/[^/]+/fd/)")


def _names_descriptor(path) -> bool:
    """Whether `path`, or a link on the way from it to its file, names an open file descriptor
    (/dev/stdout, /dev/fd/N, /proc/self/fd/N, or a link to their folder). Such a link to a pipe
    resolves to no path, so the folder is resolved first, then the last name link by link."""
    p = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit on links followed
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        if _DESCRIPTOR_PATH.match(p):
            return True
        try:
            link = os.readlink(p)
        except OSError:  # not a link, or missing
            return False
        p = os.path.normpath(os.path.join(os.path.dirname(p), link))
    return False


def _names_closed_stdout(path: str) -> bool:
    """Whether `path` names this process's descriptor 1 (/dev/stdout, /dev/fd/1,
    /proc/self/fd/1) while standard output is closed (`>&-`): the path then leads nowhere, and
    is refused as a closed stdout, not as a missing file."""
    if sys.stdout is not None:
        return False
    pid = os.getpid()
    own = re.compile(rf"/(dev/(stdout|fd/1)|proc/(self|thread-self|{pid})(/task/\d+)?/fd/1)")
    p = os.path.abspath(path)
    return bool(own.fullmatch(p) or own.fullmatch(os.path.realpath(p)))


def _writes_stdout(path: Optional[str], flag: str) -> bool:
    """Whether the output path `path` (of option `flag`) writes standard output: `-`,
    /dev/stdout, or the file stdout is redirected to. InputError when stdout is closed."""
    to_stdout = path is not None and (path == "-" or _names_stream(path, sys.stdout)
                                      or _names_closed_stdout(path))
    if to_stdout and sys.stdout is None:  # started with standard output closed (`>&-`)
        raise InputError(f"{flag} {path}: standard output is closed")
    return to_stdout


def _reads_stdin(path: Optional[str]) -> bool:
    """Whether the input path `path` reads standard input: `-`, /dev/stdin, /dev/fd/0."""
    return path is not None and (path == "-" or (_names_descriptor(path)
                                                 and _names_stream(path, sys.stdin)))


def _names_stream(path: str, stream) -> bool:
    """Whether `path` names the file that `stream` (sys.stdin, sys.stdout) reads or writes:
    /dev/stdout, /dev/fd/1, or the file it was redirected from or to."""
    try:
        here, there = os.stat(path), os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False  # no such file, or the stream closed or not a file descriptor
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _either(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


# The op's array arguments that `attnkit topk` reads from files, with their flags.
_FILE_ARRAYS = (("x", "--input"), ("begin", "--begin"), ("end", "--end"),
                ("index_offset", "--index-offset"))


def _file_of(args, name: str) -> Optional[str]:
    return args.input if name == "x" else getattr(args, name)


def _in_cli_terms(message: str, args) -> str:
    """An error of topk in the command's terms: one about an array read from a file led by its
    flag and path, one about a value option by its flag and value."""
    for name, flag in _FILE_ARRAYS:
        path = _file_of(args, name)
        for lead in (f"topk: {name} ", f"topk: {name}[", f"topk: {name}."):
            if path is not None and message.startswith(lead):
                return f"{flag} {path}: {message.removeprefix('topk: ')}"
    m = re.match(r"topk: (index_fill|value_fill) = (\S+?);? (.*)$", message)
    if m:
        return f"--{m.group(1).replace('_', '-')} {m.group(2)}: {m.group(3)}"
    return message


class _Unread:
    """A stream read from its start again: `head`, its first bytes that were read already, and
    then the rest of `stream`. Short reads are allowed, as numpy's reader loops over them."""

    def __init__(self, head: bytes, stream):
        self._head, self._stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            return self._stream.read(size)
        if size < 0:
            out, self._head = self._head + self._stream.read(), b""
        else:
            out, self._head = self._head[:size], self._head[size:]
        return out


def load_npy(path: str, what: str, allowed: Sequence[str], ranks: Sequence[int]):
    """The array in `path`, in native byte order, or InputError saying what is wrong."""
    import ml_dtypes
    import numpy as np

    if not path:
        raise InputError(f"{what} '': empty path")
    p = Path("/dev/stdin" if path == "-" else path)
    try:
        exists, is_dir = p.exists(), p.is_dir()
    except OSError as e:  # e.g. a name too long, a folder that cannot be searched
        raise InputError(f"{what} {path}: {e.strerror or _one_line(e)}") from None
    if not exists:
        raise InputError(f"{what} {path}: no such file")
    if is_dir:
        raise InputError(f"{what} {path}: is a directory, not a .npy file")
    # One open: a pipe (/dev/stdin, a shell's <(...)) cannot be read from the start again.
    try:
        with open(p, "rb") as f:
            magic = f.read(6)
            if magic != b"\x93NUMPY":
                hint = (" (it is a zip archive such as .npz; pass a .npy file)"
                        if magic[:2] == b"PK" else "")
                raise InputError(f"{what} {path}: not a .npy file{hint}")
            try:
                if f.seekable():
                    f.seek(0)
                    a = np.load(f, allow_pickle=False)
                else:  # as many bytes as the header asks for, as from a file, and no more
                    a = np.lib.format.read_array(_Unread(magic, f), allow_pickle=False)
            # numpy raises ValueError, OSError or EOFError for broken headers.
            except Exception as e:
                why = _one_line(e)
                # numpy's message for a header that is not a literal quotes a parser's node or
                # token position.
                if (isinstance(e, SyntaxError) or type(e).__name__ == "TokenError"
                        or re.search(r"<[\w.]+ object at 0x[0-9a-fA-F]+>", why)):
                    why = "its header is not a literal dict of descr, fortran_order and shape"
                raise InputError(f"{what} {path}: unreadable .npy file: {why}") from None
    except OSError as e:
        raise InputError(f"{what} {path}: cannot read: {e.strerror or _one_line(e)}") from None

    dt = a.dtype
    # NumPy stores ml_dtypes.bfloat16 as a plain 2-byte void ('<V2'): read it back as bfloat16.
    if dt.kind == "V" and dt.itemsize == 2 and dt.fields is None and dt.subdtype is None:
        a = a.view(ml_dtypes.bfloat16)
        name = "bfloat16"
    elif dt.kind in "fiu" and dt.byteorder not in ("=", "|"):
        a = a.astype(dt.newbyteorder("="))
        name = a.dtype.name
    else:
        name = "bfloat16" if dt == np.dtype(ml_dtypes.bfloat16) else dt.name
    if name not in allowed:
        raise InputError(f"{what} {path}: dtype {name} is not supported; expected "
                         f"{_either(allowed)}")
    if a.ndim not in ranks:
        want = _either([f"{r}-D" for r in ranks])
        raise InputError(f"{what} {path}: shape {list(a.shape)} has {a.ndim} dimensions; "
                         f"expected {want}")
    return np.ascontiguousarray(a)


def _same_file(a: str, b: str) -> bool:
    """Whether paths a and b name one existing file (links and hard links included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either is missing or unreadable: not one file
        return False


def cmd_topk(args) -> int:
    import numpy as np

    from . import _MAX_THREADS, _arrays, set_num_threads
    from .topk import OUT_BUFFERS_HINT, topk

    if args.threads is not None:
        if not 1 <= args.threads <= _MAX_THREADS:
            raise InputError(f"--threads {args.threads}: must be in [1, {_MAX_THREADS}]")
        set_num_threads(args.threads)
    if not 0 <= args.k <= 2**31 - 1:
        raise InputError(f"-k {args.k}: must be in [0, 2^31 - 1]")
    if not args.output:
        raise InputError("--output '': empty path")
    to_stdout = _writes_stdout(args.output, "--output")
    # A file opened to be read (`-o /dev/stdin < x.npy`) is refused; a device is not: writing
    # /dev/null with stdin from /dev/null (cron, CI) harms nothing.
    if (args.output != "-" and _names_stream(args.output, sys.stdin)
            and not stat.S_ISCHR(os.stat(args.output).st_mode)):
        raise InputError(f"--output {args.output}: is standard input")
    for name, flag in _FILE_ARRAYS:
        path = _file_of(args, name)
        # With `-` the output is where stdout goes, which may be an input's file too.
        if path and (_names_stream(path, sys.stdout) if args.output == "-"
                     else _same_file(args.output, path)):
            raise InputError(f"--output {args.output}: is the file of {flag}; writing it would "
                             f"replace that input")
    # Standard input is read once: a second `-` (or /dev/stdin) would find it empty, the rest of
    # a stream, or the same file again.
    readers = [(flag, _file_of(args, name)) for name, flag in _FILE_ARRAYS
               if _reads_stdin(_file_of(args, name))]
    if len(readers) > 1:
        raise InputError(f"{readers[1][0]} {readers[1][1]}: standard input is already read by "
                         f"{readers[0][0]}")
    x = load_npy(args.input, "--input", _arrays.X_DTYPES, (1, 2))
    rows = {}
    for name, flag in _FILE_ARRAYS[1:]:
        path = _file_of(args, name)
        if path is not None:
            rows[name] = load_npy(path, flag, _ROW_DTYPES, (1,))

    start = time.perf_counter()
    try:
        values, indices = topk(
            x, args.k, largest=args.largest, sorted=args.sorted, indices_dtype=args.indices_dtype,
            return_values=not args.no_values, index_fill=args.index_fill,
            value_fill=args.value_fill, nan=args.nan, ties=args.ties, **rows)
    except (ValueError, TypeError) as e:
        raise InputError(_in_cli_terms(_one_line(e), args)) from None
    except MemoryError as e:
        message = str(e)
        if message.startswith(f"topk: k = {args.k} "):  # the outputs' size, checked first
            why = message.removeprefix(f"topk: k = {args.k} ").replace(OUT_BUFFERS_HINT, "")
        elif message.startswith("topk: "):  # the CPU backend's working buffers
            why = message.removeprefix("topk: ")
        else:  # an allocator's own, for the outputs
            why = "the [B, k] outputs do not fit in memory"
        raise InputError(f"-k {args.k}: {why or 'out of memory'}") from None
    elapsed = time.perf_counter() - start

    arrays = {"indices": indices}
    if values is not None:
        arrays["values"] = values
    try:
        if to_stdout:  # the archive is the output: the summary goes to stderr
            np.savez(sys.stdout.buffer, **arrays)
            sys.stdout.buffer.flush()
        else:
            _write_archive(Path(args.output), arrays)
    except BrokenPipeError:
        raise  # the reader of stdout went away: main stops quietly, as for the demo
    except OSError as e:
        why = e.strerror or _one_line(e)
        raise InputError(f"--output {args.output}: cannot write: {why}") from None

    parts = [f"{name} {a.dtype.name} {list(a.shape)}"
             for name, a in sorted(arrays.items(), reverse=True)]
    report = sys.stderr if to_stdout else sys.stdout
    if report is not None:  # print(file=None) would write to stdout, after the archive
        print(f"{'stdout' if to_stdout else args.output}: {', '.join(parts)} (top-{args.k} of "
              f"{list(x.shape)} in {elapsed * 1e3:.2f} ms)", file=report)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# attnkit info / demo
# ---------------------------------------------------------------------------------------------


def cmd_info(args) -> int:
    from . import info

    print(info(), end="")
    return EXIT_OK


def cmd_demo(args) -> int:
    from . import _demo

    # JSON on standard output: alone there, the report goes to standard error.
    try:
        return _demo.run(args, json_to_stdout=_writes_stdout(args.json, "--json"))
    except _demo.DemoUsageError as e:
        raise InputError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnkit",
        description="attnkit: top-k and related kernels for sparse and linear attention.",
        epilog="Exit codes: 0 success, 1 a demo check failed or the report could not be "
               "printed, 2 usage or input error or an output file could not be written, 130 "
               "interrupted, 141 the reader of standard output went away (a closed pipe).")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="run the seed top-k workloads, check them and time them",
        description="Runs the DSA indexer and sampling top-k workloads on the CPU (or on the "
                    "GPU when attnkit was built with CUDA and torch sees a GPU), checks every "
                    "result against the reference backend and prints a table of times and "
                    "speed-ups over std::nth_element, std::partial_sort and "
                    "numpy.argpartition (on the GPU: torch.topk).")
    demo.add_argument("--quick", action="store_true", help="smaller sizes, for smoke tests")
    demo.add_argument("--cases", metavar="LIST",
                      help="comma-separated case names or shell patterns (see --list)")
    demo.add_argument("--list", action="store_true", help="list the cases and exit")
    demo.add_argument("--json", metavar="PATH",
                      help="write every number and the machine to PATH ('-': standard output, "
                           "the report then going to standard error)")
    demo.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                      help="where to run (default: the GPU when usable, else the CPU)")
    demo.add_argument("--repeats", type=int, metavar="N",
                      help="timed runs per method, the median is reported (default 7; 5 with "
                           "--quick)")
    demo.add_argument("--warmup", type=int, default=1, metavar="N",
                      help="untimed runs before timing (default 1)")
    demo.add_argument("--threads", type=int, metavar="N",
                      help="CPU threads for attnkit and every baseline (default: "
                           "ATTNKIT_NUM_THREADS or one a CPU the process may run on)")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=cmd_demo)

    tk = sub.add_parser(
        "topk", help="top-k of the rows of a .npy file, written to a .npz file",
        description="Selects the k best elements of each row of a [B, N] or [N] array stored "
                    "in a .npy file (float32, float16, or bfloat16 saved with ml_dtypes) and "
                    "writes 'values' and 'indices' to a .npz file. bfloat16 values are stored "
                    "as NumPy stores ml_dtypes.bfloat16, a 2-byte void dtype; read them with "
                    ".view(ml_dtypes.bfloat16).")
    tk.add_argument("--input", "-i", required=True, metavar="X.npy",
                    help="the scores x (.npy); - for stdin")
    tk.add_argument("-k", "--k", type=int, required=True, help="elements per row (>= 0)")
    side = tk.add_mutually_exclusive_group()
    side.add_argument("--largest", dest="largest", action="store_true", default=True,
                      help="select the largest values (default)")
    side.add_argument("--smallest", dest="largest", action="store_false",
                      help="select the smallest values")
    tk.add_argument("--sorted", choices=("none", "index", "value"), default="none",
                    help="order of each output row (default none)")
    tk.add_argument("--begin", metavar="BEGIN.npy", help="[B] int32/int64 first valid column")
    tk.add_argument("--end", metavar="END.npy", help="[B] int32/int64 end of the valid columns")
    tk.add_argument("--index-offset", metavar="OFFSET.npy",
                    help="[B] int32/int64 added to the indices of each row")
    tk.add_argument("--indices-dtype", choices=_ROW_DTYPES, default="int64",
                    help="dtype of the indices (default int64)")
    tk.add_argument("--nan", choices=("largest", "ignore", "raise"), default="largest",
                    help="NaN handling (default largest: NaN ranks above +inf)")
    tk.add_argument("--ties", choices=("lowest_index", "any"), default="lowest_index",
                    help="which of the elements equal to the k-th are kept")
    tk.add_argument("--index-fill", type=int, default=-1,
                    help="index of padding slots when a row has fewer than k elements")
    tk.add_argument("--value-fill", type=float, default=None,
                    help="value of padding slots (default -inf, or +inf with --smallest)")
    tk.add_argument("--no-values", action="store_true", help="write only the indices")
    tk.add_argument("--threads", type=int, metavar="N", help="CPU threads")
    tk.add_argument("--output", "-o", required=True, metavar="OUT.npz",
                    help="where to write 'values' and 'indices' (.npz); - for stdout")
    tk.set_defaults(func=cmd_topk)

    info = sub.add_parser("info", help="print the build information",
                          description="Prints attnkit's version, compiler, CPU threads and "
                                      "CUDA targets and devices.")
    info.set_defaults(func=cmd_info)
    return parser


def _complain(message: str) -> None:
    """Prints `message` on stderr; nowhere when stderr is closed (`2>&-`), where print would
    fall back to stdout, which may hold an archive or the demo's JSON."""
    if sys.stderr is not None:
        print(message, file=sys.stderr)


def _join_value_fill(argv: Sequence[str]) -> list[str]:
    """argv with `--value-fill V` as `--value-fill=V` where V is a number: argparse reads only
    plain negatives such as -1.5 as values, and takes -inf or -1e3 for options."""
    out: list[str] = []
    it = iter(argv)
    for token in it:
        if token == "--value-fill":
            value = next(it, None)
            if value is None:
                out.append(token)
                break
            try:
                float(value)
            except ValueError:
                out += [token, value]
                continue
            token = f"--value-fill={value}"
        out.append(token)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = _join_value_fill(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # exits with code 2 on a usage error
    if args.command is None:
        parser.error("a command is required: demo, topk or info")  # exits with code 2
    try:
        return args.func(args)
    except InputError as e:
        _complain(f"attnkit {args.command}: error: {e}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _complain(f"attnkit {args.command}: interrupted")
        return 130
    except OSError as e:
        # Writing the report failed: the reader went away (`attnkit demo | head`) or the disk
        # is full. stdout goes to devnull, so that the interpreter's final flush does not fail
        # again; a closed pipe stops quietly, as other tools do.
        if sys.stdout is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if isinstance(e, BrokenPipeError):
            return 141
        _complain(f"attnkit {args.command}: error: {e.strerror or _one_line(e)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
