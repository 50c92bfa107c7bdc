"""A binary's process ends without the interpreter's teardown (svmattn.study.process_end), yet with
every effect of a normal exit: its exit status, its message, its buffered output, the threads it
waits for and its atexit callbacks."""
import os
import subprocess
import sys
import textwrap

import pytest

from svmattn.study import process_end

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from svmattn.study import process_end

    def main(argv):
      out, how = argv[1], argv[2]
      def late():                       # a thread that is not a daemon: the exit waits for it
        time.sleep(0.3)
        open(out + ".thread", "w").write("joined")
      threading.Thread(target=late).start()
      atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
      sys.stdout.write("no newline, still buffered")    # flushed by the exit
      if how == "message":
        sys.exit("error: a message")
      if how == "status":
        return 3
      if how == "raise":
        raise ValueError("a traceback as usual")
      return 0

    process_end.run_main(main)
    print("never here")
    """)


def _run(tmp_path, how):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = str(tmp_path / how)
  proc = subprocess.run([sys.executable, "-c", PROGRAM, out, how], capture_output=True, text=True, env=env,
                        timeout=120, stdin=subprocess.DEVNULL)
  effects = {name: os.path.exists(f"{out}.{name}") for name in ("thread", "atexit")}
  return proc, effects


@pytest.mark.parametrize("how, status", [("ok", 0), ("status", 3), ("message", 1), ("raise", 1)])
def test_a_binary_ends_with_every_effect_of_a_normal_exit(tmp_path, how, status):
  proc, effects = _run(tmp_path, how)
  assert proc.returncode == status, proc.stderr
  assert proc.stdout == "no newline, still buffered"          # flushed, and nothing after run_main
  assert effects == {"thread": True, "atexit": True}
  if how == "message":
    assert proc.stderr.strip().splitlines()[-1] == "error: a message"
  if how == "raise":
    assert "ValueError: a traceback as usual" in proc.stderr


def test_status_of_reads_sys_exit_codes(capsys):
  assert [process_end.status_of(c) for c in (None, 0, 4)] == [0, 0, 4]
  assert process_end.status_of("error: x") == 1
  assert capsys.readouterr().err == "error: x\n"
