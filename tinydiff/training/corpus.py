"""Training text: TinyStories files read into a list of clean stories.

Two layouts occur (see shared/data/README.md):
  * `<|endoftext|>` between stories (the cased V1 and V2 train files). A file cut mid-story ends
    without the separator; that last fragment is dropped.
  * blank lines between stories AND between paragraphs (the V1 validation prefix), so there is no
    exact story boundary. A paragraph starts a new story when it opens like one ("Once upon a
    time", "Once there was", "Tom and Mia were best friends"), or when it opens on a character
    ("Sara liked to help...", "One day, a little boy named Tim...") whom the story so far has not
    named: stories are short and each brings its own characters. Names are the words the file
    capitalises inside sentences. Any other paragraph continues the current story. This is a
    guess (on the validation prefix: 945 stories, where the file's size says about 900 and the
    opening phrases alone found 835); a wrong boundary moves an <|endoftext|> but changes no
    scored text, and scoring by paragraph (split_paragraphs) does not depend on it.

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


_WORD = re.compile(r"\b[A-Z][a-z]+\b")
_INSIDE_CAPITAL = re.compile(r"(?<=[a-z,;] )([A-Z][a-z]+)\b")
_FIRST_SENTENCE = re.compile(r"[^.!?]*[.!?]?")
_ONE_DAY = re.compile(r"(One (\w+ )?(day|morning|afternoon|evening|night)|Today),")
# capitalised inside sentences, but not a character of one story: titles, family words, days
_NOT_NAMES = {"I", "Mom", "Dad", "Mommy", "Daddy", "Mum", "Mummy", "Mama", "Papa", "Grandma", "Grandpa", "Granny",
              "Aunt", "Uncle", "Mr", "Mrs", "Miss", "Baby", "The", "End", "God", "Santa", "Christmas", "Monday",
              "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "Will"}


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
    paragraphs = [p for p in map(_clean, re.split(r"\n[ \t]*\n", text)) if p]
    names = _names(paragraphs)
    stories, named = [], set()                   # named: the characters of the current story
    for para in paragraphs:
        first = set(_WORD.findall(_FIRST_SENTENCE.match(para).group(0))) & names   # named in its first sentence
        new_character = first and not first & named and _opens_on_character(para, names)
        if not stories or _STORY_START.match(para) or new_character:
            stories.append(para)
            named = set()
        else:
            stories[-1] += "\n" + para
        named |= set(_WORD.findall(para)) & names
    return stories


def split_paragraphs(stories):
    """Each story's paragraphs, in order: the unit published tiny-model evaluations score. A
    paragraph is a line of the story's text (in the validation prefix, 18 of its 4,302 blank-line
    paragraphs hold a line break inside dialogue and count as their lines: 4,356 in all)."""
    return [para for story in stories for para in story.split("\n")]


def _names(paragraphs):
    """The words the text capitalises after a lower-case word or a comma: its characters' names."""
    return {m.group(1) for p in paragraphs for m in _INSIDE_CAPITAL.finditer(p)} - _NOT_NAMES


def _opens_on_character(para, names):
    """'Sara liked...', 'Tom and Mia were...', 'One day, a boy named Tim...', 'Today, Joe was...'"""
    word = _WORD.match(para)
    return bool(word and word.group(0) in names) or bool(_ONE_DAY.match(para))


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
