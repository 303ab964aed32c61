#!/usr/bin/python3
"""Runs a command on a pseudo-terminal of a given size and reports what a person would have seen.

The command's output goes through pyte (a VT100 emulator) rather than a byte log, so the report is about the
screen: after every burst of output (a frame) the rows that show a progress percentage are counted, and each is
checked to leave the last column free (after a resize, the lowest of them: the live one). With --resize COLS, the
terminal is resized (SIGWINCH) once the first progress row has been seen.

    screen.py --cols 60 --rows 24 [--resize 40] -- stitch get URL -o FILE     (SCREEN_DEBUG=1: every read and frame on stderr)

Prints one JSON object: the exit status, the final screen's rows (right-stripped), and per phase (before and after
the resize) the number of frames with progress, the most progress rows seen at once, and the progress rows that
reached the last column; the first progress rows seen (up to five, in order); how many times the program erased a
screen with something on it from its top (what tmux, with scroll-on-clear, moves into its history: a copy of the
screen each time); with --look-for TEXT, whether any frame showed TEXT.
"""
import argparse
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios

import pyte

PROGRESS = re.compile(r"\d+%")


class ClearingScreen(pyte.Screen):
    """A screen that counts erases of the whole screen (ED from the top-left, or ED 2/3) while it shows something:
    tmux's scroll-on-clear keeps each of them in its history."""

    def __init__(self, *args):
        super().__init__(*args)
        self.clears = 0

    def erase_in_display(self, how=0, *args, **kwargs):
        whole = how in (2, 3) or (how == 0 and self.cursor.x == 0 and self.cursor.y == 0)
        if whole and any(row.strip() for row in self.display):
            self.clears += 1
        super().erase_in_display(how, *args, **kwargs)


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cols", type=int, required=True)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--resize", type=int)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--look-for", action="append", default=[], help="report whether any frame showed TEXT")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    master, slave = os.openpty()
    set_size(slave, args.rows, args.cols)

    def controlling_terminal():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    child = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=controlling_terminal, close_fds=True)
    os.close(slave)

    screen = ClearingScreen(args.cols, args.rows)
    first_progress = []
    stream = pyte.ByteStream(screen)
    phases = [{"frames": 0, "max_progress_rows": 0, "full_rows": []}, {"frames": 0, "max_progress_rows": 0, "full_rows": []}]
    phase = 0
    cols = args.cols
    seen = {text: False for text in args.look_for}

    def look():
        nonlocal phase, cols
        for text in seen:
            seen[text] = seen[text] or any(text in row for row in screen.display)
        rows = [y for y, row in enumerate(screen.display) if PROGRESS.search(row)]
        if not rows:
            return
        for y in rows:
            text = screen.display[y].rstrip()
            if len(first_progress) < 5 and text not in first_progress:
                first_progress.append(text)
        record = phases[phase]
        if os.environ.get("SCREEN_DEBUG"):
            print(f"frame phase {phase}:", [screen.display[y].rstrip() for y in rows], file=sys.stderr)
        record["frames"] += 1
        record["max_progress_rows"] = max(record["max_progress_rows"], len(rows))
        # The last column, read from the cells (display strings drop the second cell of a wide character). After
        # the resize only the live row, the lowest, is held to it: a copy left above from before is cut by the
        # emulator, not drawn by the program.
        for y in (rows if phase == 0 else rows[-1:]):
            if screen.buffer[y][cols - 1].data.strip():
                record["full_rows"].append(screen.display[y].rstrip())
        if args.resize and phase == 0:
            phase = 1
            cols = args.resize
            set_size(master, args.rows, cols)
            screen.resize(args.rows, cols)
            os.kill(child.pid, signal.SIGWINCH)

    import time
    deadline = time.monotonic() + args.timeout
    timed_out = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            child.kill()
            break
        ready, _, _ = select.select([master], [], [], min(remaining, 0.5))
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not data:
            break
        if os.environ.get("SCREEN_DEBUG"):
            print(f"read (phase {phase}): {data[:300]!r}", file=sys.stderr)
        stream.feed(data)
        # A frame ends when no more output follows within 20 ms (one redraw is one write).
        more, _, _ = select.select([master], [], [], 0.02)
        if not more:
            look()
    status = child.wait()
    json.dump({
        "status": status, "timed_out": timed_out,
        "final": [row.rstrip() for row in screen.display],
        "phases": phases, "seen": seen, "first_progress": first_progress, "clears": screen.clears,
    }, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
