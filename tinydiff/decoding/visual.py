"""A live terminal view of denoising: the canvas redrawn in place after every step.

Masked positions show as a block character, the tokens the last step committed in bold green, the
rest plain. When the stream is not a terminal nothing is drawn while denoising and finish() prints
only the final text, so piped output is the same as without the view.

    view = LiveView(model.tokenizer, sys.stdout, start=len(prompt_ids))
    text = model.denoise(prompt, on_step=view.on_step)
    view.finish(text)
"""
import itertools
import shutil
import sys
import unicodedata

import numpy as np

MASK_CHAR = "░"
NEW_STYLE, RESET = "\x1b[1;32m", "\x1b[0m"
MASKED, NEW, OLD = 0, 1, 2


def masked_text(tokenizer, ids, committed):
    """The text of canvas ids, each run of masked positions shown as MASK_CHARs, each run of
    committed ones decoded whole (a character split across tokens comes out right)."""
    out, at = [], 0
    for done, group in itertools.groupby(np.asarray(committed, bool)):
        n = len(list(group))
        out.append(tokenizer.text([int(i) for i in ids[at:at + n]]) if done else MASK_CHAR * n)
        at += n
    return "".join(out)


class LiveView:
    def __init__(self, tokenizer, stream=None, start=0, given=None):
        """start: the first canvas position shown (e.g. the prompt length). given: a bool per canvas
        position that was never masked (default: those before `start`), so step 0 highlights only
        what it committed."""
        self.tokenizer = tokenizer
        self.stream = stream if stream is not None else sys.stdout
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = start
        self.seen = None if given is None else np.asarray(given, bool)[start:]
        self.rows = 0                                   # terminal rows the last drawing took

    def on_step(self, step, canvas_ids, committed_mask):
        """The denoisers' on_step(step, canvas_ids, committed_mask)."""
        committed = np.asarray(committed_mask, bool)[self.start:]
        seen = self.seen if self.seen is not None else np.zeros_like(committed)
        self.seen = committed
        if not self.live:
            return
        state = np.where(~committed, MASKED, np.where(seen, OLD, NEW))
        self._redraw(self._render(np.asarray(canvas_ids)[self.start:], state))

    def finish(self, text):
        """Replaces the drawing with the final text (or just prints it when not a terminal)."""
        self._redraw([(OLD, text)])
        self.stream.write("\n")
        self.stream.flush()

    def _render(self, ids, state):
        """[(state, text)] for runs of consecutive positions in one state; a run is decoded whole so a
        character split across tokens comes out right."""
        runs, at = [], 0
        for s, group in itertools.groupby(state):
            n = len(list(group))
            runs.append((s, MASK_CHAR * n if s == MASKED else self._decode(ids[at:at + n])))
            at += n
        return runs

    def _decode(self, ids):
        if self.tokenizer is None:
            return "".join(f"<{i}>" for i in ids)
        return self.tokenizer.text([int(i) for i in ids])

    def _redraw(self, runs):
        runs = [(s, _printable(text)) for s, text in runs]
        out = []
        if self.live and self.rows:                     # back to the drawing's first row, clear below
            out.append("\r" + (f"\x1b[{self.rows - 1}A" if self.rows > 1 else "") + "\x1b[J")
        out += [NEW_STYLE + text + RESET if s == NEW and self.live else text for s, text in runs]
        self.stream.write("".join(out))
        self.stream.flush()
        self.rows = _rows("".join(text for _, text in runs), shutil.get_terminal_size().columns)


def _printable(text):
    """Text safe to write to a terminal: tabs as a space, other control characters (an escape a
    model produced) as U+FFFD; newlines stay."""
    return "".join(c if c == "\n" or unicodedata.category(c) != "Cc" else " " if c == "\t" else "\ufffd"
                   for c in text)


def _rows(text, columns):
    """Terminal rows `text` takes when written from column 0, wide characters counting two."""
    def width(line):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)
    return sum(max(1, -(-width(line) // columns)) for line in text.split("\n"))
