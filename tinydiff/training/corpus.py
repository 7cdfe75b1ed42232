"""Training text: TinyStories files read into a list of clean stories.

Two layouts occur (see shared/data/README.md):
  * `<|endoftext|>` between stories (the cased V1 and V2 train files). A file cut mid-story ends
    without the separator; that last fragment is dropped.
  * blank lines between stories AND between paragraphs (the V1 validation prefix), so there is no
    exact story boundary. A paragraph that opens like a story ("Once upon a time", "Once there
    was", "Tom and Mia were best friends", ...) starts a new one; any other paragraph continues the
    current one. This is a guess: some stories get glued to the one before (and a few split), which
    moves an <|endoftext|> but changes no scored text.

Every story comes out in the cased train files' own form: mojibake repaired, trailing spaces cut,
paragraphs joined by a single newline, no leading or trailing whitespace.
"""
import re

from ..errors import UsageError

EOT = "<|endoftext|>"

# UTF-8 punctuation that was once decoded as cp1252 and re-encoded (the validation and lower-case
# files carry it). cp1252 has no character for byte 0x9d, so in the validation file the closing
# quote ” (E2 80 9D) mostly lost its last byte: a bare "â€" is that quote. The longest pattern is
# tried first, so "â€" only matches when none of the others does.
MOJIBAKE = {
    "â€œ": "\u201c", "â€\x9d": "\u201d", "â€™": "\u2019", "â€˜": "\u2018",
    "â€”": "\u2014", "â€“": "\u2013", "â€¦": "\u2026", "â€Š": "\u200a", "â€": "\u201d",
}
_MOJIBAKE_RE = re.compile("|".join(re.escape(k) for k in sorted(MOJIBAKE, key=len, reverse=True)))

# How the stories of TinyStories begin; used only to find story starts in blank-line-separated text.
_STORY_START = re.compile(r"Once upon a time|Once there (was|were|lived)|Once,|Once a |Once in "
                          r"|[A-Z][a-z]+( and [A-Z][a-z]+)? (was|were|is|are) (a|an|two|twins|best friends)\b")


def repair_mojibake(text):
    return _MOJIBAKE_RE.sub(lambda m: MOJIBAKE[m.group(0)], text)


def read_text(path):
    """The file's text, strictly UTF-8; a UsageError naming the file for empty or undecodable data."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    if not text.strip():
        raise UsageError(f"{path}: no text")
    return text


def _clean(story):
    lines = (line.rstrip() for line in story.strip().split("\n"))
    return "\n".join(line for line in lines if line)


def split_stories(text):
    """[story]; see the module docstring for the two layouts."""
    text = repair_mojibake(text.replace("\r\n", "\n"))
    if EOT in text:
        pieces = text.split(EOT)
        if pieces[-1].strip():
            pieces.pop()  # the file was cut inside this story
        return [s for s in map(_clean, pieces) if s]
    stories = []
    for para in re.split(r"\n[ \t]*\n", text):
        para = _clean(para)
        if not para:
            continue
        if stories and not _STORY_START.match(para):
            stories[-1] += "\n" + para
        else:
            stories.append(para)
    return stories


def load_stories(paths):
    """All stories of all files, in order; a UsageError if a file holds none."""
    stories = []
    for path in paths:
        found = split_stories(read_text(path))
        if not found:
            raise UsageError(f"{path}: no complete story")
        stories += found
    return stories


def overlap(train, val):
    """How many validation stories also occur in the training stories (exact match)."""
    seen = set(train)
    return sum(s in seen for s in val)
