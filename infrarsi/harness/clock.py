"""The harness-owned step clock: a cross-rank barrier, a device sync, then ``perf_counter``.

Patches cannot touch this file (it is outside the editable scope and frozen by the contract),
but the patched model runs in the same interpreter and could still reach the clock's objects at
run time (its module globals, ``time``). So every synchronized step boundary is also sent to a
small **timer process** (:data:`TIMER_ARGS`: a bare ``python -I -S``) that timestamps it on its
own ``CLOCK_MONOTONIC`` (on Linux from the kernel's send-time stamp of the message, see
:data:`TIMER_SRC`): nothing the patched code can rebind runs there. At the end the two clocks
are compared; a disagreement scheduling cannot explain is clock tampering
(:class:`ClockTamperError`, whose message gives the outside clock's step times).

A process keeps its timer between clocks (a warm pool's worker runs many trials): starting one
is a ``python`` start-up, 25-40 ms before every trial's first step on a loaded 2-core box. Each
clock reads back only its own marks: it ends its session with a fresh random tag, and the timer
answers with the tag and the marks it received since the last session. A timer that answers
with the wrong number of marks, or not at all, is not kept (the check reports the mismatch as
it always did). A warm pool never runs untrusted code in a process a later trial uses, so a
kept timer only ever served trusted code.
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

# Private references taken when the harness is imported (before any patched code runs).
_perf = time.perf_counter
_wall = time.time

# The timer process: one monotonic timestamp (ns) per mark message ("m") received. A session is
# "s<tag>" ... "e<tag>": the end answers "<tag> <foreign ends> <timestamps...>" on one line and
# the marks start over; an "e" message with another tag ends nothing and is counted as foreign
# (only the clock knows its tag: anything else writing to the timer is tampering).
# It says "r" once it reads, so no mark is timestamped late by the timer's own start-up.
# Its stdin is a Unix seqpacket socket where the system has one: Linux stamps each message with
# the time it was sent (SO_TIMESTAMPNS, CLOCK_REALTIME, moved to the monotonic clock at receipt),
# so a timer process the scheduler left waiting still times every mark right. The move reads the
# real-time clock before the monotonic one: a timer preempted between the two reads then dates a
# mark later, never earlier, than it was sent (earlier would read as the trial's clock running
# ahead: tampering). Elsewhere (a pipe, or no stamp) a mark is timed when the timer reads it.
TIMER_SRC = ("import socket,struct,sys,time\nm=time.monotonic_ns\nw=time.time_ns\n"
             "try:s=socket.socket(fileno=0)\nexcept OSError:s=None\n"
             "if s:\n try:s.setsockopt(1,35,1)\n except OSError:pass\n"
             " def r():\n  d,a,_,_=s.recvmsg(256,64);z=w();t=m()\n"
             "  for l,y,v in a:\n   if l==1 and y==35 and len(v)>=16:"
             "q=struct.unpack('qq',v[:16]);t+=q[0]*10**9+q[1]-z\n"
             "  return d,t\n"
             "else:\n i=sys.stdin.buffer.readline\n def r():return i(),m()\n"
             "o=sys.stdout\nts=[]\ng=b''\nx=0\no.write('r');o.flush()\n"
             "while 1:\n l,t=r()\n if not l:break\n c=l[:1]\n"
             " if c==b'm':ts.append(t)\n"
             " elif c==b's':g=l[1:-1];ts=[];x=0\n"
             " elif c==b'e' and g and l[1:-1]==g:"
             "o.write(' '.join([g.decode(),str(x),*map(str,ts)])+'\\n');o.flush();ts=[];g=b''\n"
             " else:x+=1\n")
TIMER_ARGS = (sys.executable, "-I", "-S", "-c", TIMER_SRC)
TIMER_REPLY_TIMEOUT_S = 30.0

# The two clocks read the same step boundaries, the outside one later: the send, then the
# kernel's stamp (or, without one, the timer's wake-up: ~0.1 ms quiet, but on a heavily loaded
# box it can sleep through ~100 ms and read two marks at once). So an honest mark's lag
# (outside - inside) is never negative (the in-process stamp is taken before the write; both
# read CLOCK_MONOTONIC where SAME_CLOCK) and is sometimes large. Tampering is called only on
# evidence scheduling cannot produce, since missing a subtle one costs nothing (a trial's step
# times are always the outside timer's): the in-process clock ahead of the outside one (lag
# below -CLOCK_LEAD_S), behind it at every mark by more than CLOCK_LAG_S (a rescaled clock: the
# gaming patches' "2x" reads half the monotonic time), or drifting against it (Theil-Sen slope
# of the lag, robust to a few late wake-ups) by more than CLOCK_RTOL and more than
# CLOCK_DRIFT_ATOL_S over the trial.
SAME_CLOCK = (time.get_clock_info("perf_counter").implementation
              == time.get_clock_info("monotonic").implementation)
CLOCK_LEAD_S = 0.002
CLOCK_LAG_S = 1.0
CLOCK_RTOL = 0.15
CLOCK_DRIFT_ATOL_S = 0.25
MAX_FIT_MARKS = 300  # evenly spaced marks the drift is fitted on (pairs grow as n^2)


def clock_drift(inside: Sequence[float], outside: Sequence[float]) -> float:
    """The in-process clock's drift against the outside one: the Theil-Sen slope of the lag
    (outside - inside) over the outside time; 0 for an honest clock, 1 - speed for a scaled one."""
    n = len(outside)
    idx = sorted({round(i * (n - 1) / (MAX_FIT_MARKS - 1)) for i in range(MAX_FIT_MARKS)}
                 if n > MAX_FIT_MARKS else range(n))
    lag = [(outside[i], outside[i] - inside[i]) for i in idx]
    slopes = [(lb - la) / (tb - ta) for k, (ta, la) in enumerate(lag) for tb, lb in lag[k + 1:]
              if tb > ta]
    return statistics.median(slopes) if slopes else 0.0


class ClockTamperError(RuntimeError):
    """The in-process clock disagrees with the outside timer: something in the trial's process
    changed what the harness's clock reads (clock tampering). The message gives the outside
    timer's step times (:func:`true_step_times` reads them back, e.g. from a Ray error)."""


_TRUE_TIMES = "true step times "


def true_step_times(message: str) -> tuple[float, ...]:
    """The outside timer's step times named in a :class:`ClockTamperError` message (the message
    crosses process boundaries as text), or () when it names none."""
    at = message.find(_TRUE_TIMES + "[")
    if at < 0:
        return ()
    body = message[at + len(_TRUE_TIMES) + 1:].split("]", 1)[0]
    try:
        return tuple(float(x) for x in body.split(",") if x.strip())
    except ValueError:
        return ()


class _Timer:
    """One timer process (:data:`TIMER_ARGS`), serving one clock at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child must not share its parent's timer
        try:  # a seqpacket socket: one message per mark, each stamped by the kernel (Linux)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except (AttributeError, OSError):  # no seqpacket here: a pipe, timed at receipt
            ours = theirs = None
        self._sock = ours
        self.proc = subprocess.Popen(TIMER_ARGS, stdin=theirs or subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        if theirs is not None:
            theirs.close()
        self._send = ours.send if ours is not None else self.proc.stdin.write
        if self.proc.stdout.read(1) != b"r":
            self.kill()
            raise RuntimeError("the step timer process did not start (python -I -S -c ...)")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def mark(self) -> None:
        self._send(b"m\n")

    def begin_session(self) -> None:
        self.tag = secrets.token_hex(8)
        self._send(b"s" + self.tag.encode() + b"\n")

    def end_session(self) -> tuple[list[float], int] | None:
        """The session's mark timestamps (s) and how many session ends the timer received
        that this clock did not send; None when the timer does not answer (gone, or silent
        for :data:`TIMER_REPLY_TIMEOUT_S`)."""
        try:
            self._send(b"e" + self.tag.encode() + b"\n")
        except OSError:  # the timer is gone
            return None
        fd, buf = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + TIMER_REPLY_TIMEOUT_S
        while True:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                head, foreign, *stamps = line.decode().split()
                if head == self.tag:
                    return [int(x) / 1e9 for x in stamps], int(foreign)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            buf += chunk

    def kill(self) -> None:
        """Let the timer go: closing its input ends it (no signal: a verifier's sandbox
        refuses to send one)."""
        for f in (self._sock, self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


_kept_timer: list[_Timer] = []  # this process's idle timer, between clocks


def _take_timer() -> _Timer:
    while _kept_timer:
        timer = _kept_timer.pop()
        if timer.pid != os.getpid():  # inherited across a fork: the parent's, left to it
            continue
        if timer.alive():
            return timer
        timer.kill()
    return _Timer()


class StepClock:
    """Marks step boundaries; every mark waits for all ranks and for the device to finish.

    ``guard`` (optional) runs after each mark: the verifier's integrity check of the process
    at every step boundary (off the timed path of real trials, where it is None).
    """

    def __init__(self, device: torch.device, guard: Callable[[], None] | None = None,
                 outside: bool = True) -> None:
        self.device = device
        self.guard = guard
        self.marks: list[float] = []
        self.wall_marks: list[float] = []
        self.outside_marks: list[float] | None = None
        self._gaps: set[int] = set()  # indices of marks that start a new interval
        self.foreign_ends = 0  # session ends the outside timer received from someone else
        self._timer = _take_timer() if outside else None
        if self._timer is not None:
            self._timer.begin_session()

    def mark(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = _perf()
        if self._timer is not None:
            self._timer.mark()
        self.marks.append(t)
        self.wall_marks.append(_wall())
        if self.guard is not None:
            self.guard()
        return t

    def restart(self) -> float:
        """Mark a new start: the time since the last mark belongs to no step (harness work
        between steps, such as the early-stop decision, is kept off every step's clock)."""
        self._gaps.add(len(self.marks))
        return self.mark()

    def _intervals(self, marks: list[float]) -> list[float]:
        return [b - a for i, (a, b) in enumerate(zip(marks, marks[1:], strict=False))
                if i + 1 not in self._gaps]

    def durations(self) -> list[float]:
        """Step times: the outside timer's once :meth:`close` read it, else the in-process ones."""
        return self._intervals(self.outside_marks if self.outside_marks is not None else self.marks)

    def close(self) -> None:
        """Read the timer's timestamps of this clock's marks (idempotent). The timer is kept
        for this process's next clock only when it answered with one timestamp per mark."""
        timer, self._timer = self._timer, None
        if timer is None:
            return
        answer = timer.end_session()
        stamps, self.foreign_ends = answer if answer is not None else ([], 0)
        self.outside_marks = stamps
        if (answer is not None and not self.foreign_ends and len(stamps) == len(self.marks)
                and not _kept_timer):
            _kept_timer.append(timer)
        else:
            timer.kill()

    def check(self) -> str | None:
        """Compare the in-process clock with the outside timer (after :meth:`close`); a problem
        (the reason, naming the class: clock tampering) or None."""
        outside = self.outside_marks
        if outside is None:
            return None
        if self.foreign_ends:
            return (f"clock tampering: the outside timer received {self.foreign_ends} session "
                    "end(s) the harness did not send")
        if len(outside) != len(self.marks):
            return (f"clock tampering: the harness marked {len(self.marks)} step boundaries, the "
                    f"outside timer received {len(outside)}")
        inside, true = self._intervals(self.marks), self._intervals(outside)
        if not true:
            return None
        lags = [o - i for o, i in zip(outside, self.marks, strict=True)]
        drift = clock_drift(self.marks, outside)
        span = outside[-1] - outside[0]
        if SAME_CLOCK and min(lags) < -CLOCK_LEAD_S:
            why = f"it reads {-min(lags) * 1e3:.1f} ms ahead of the outside timer"
        elif SAME_CLOCK and min(lags) > CLOCK_LAG_S:
            why = f"it reads {min(lags):.1f} s behind the outside timer at every step boundary"
        elif abs(drift) > CLOCK_RTOL and abs(drift) * span > CLOCK_DRIFT_ATOL_S:
            why = f"it runs at {1 - drift:.2f}x real time"
        else:
            return None
        a, b = sum(inside), sum(true)
        return (f"clock tampering: the in-process clock reads {a / len(true) * 1e3:.1f} ms per "
                f"step, the outside timer {b / len(true) * 1e3:.1f} ms ({why}; {_TRUE_TIMES}"
                f"{[round(x, 6) for x in true]} s)")
