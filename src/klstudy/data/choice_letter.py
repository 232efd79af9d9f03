"""The letter of a multiple-choice completion: one rule, judged on what a real model writes, never raising."""

from __future__ import annotations

import difflib
import re

from klstudy.data.answer_text import MAX_ANSWER_CHARS, boxes, tail

# One rule for the letter of a multiple-choice completion, judged on what a real model writes (tests/fixtures/
# real_answers: SmolLM2-135M-Instruct on the real MMLU subjects, labelled by a rule written down first). Every place
# where the completion states a choice is a candidate, and the answer is the letter of the last candidate (a model
# that changes its mind is read at its last word); a candidate that names no letter (a contradiction) reads as none.
# The places, with the question's four options where the caller has them:
#   - a box (\boxed{...}, \fbox{...}): always a candidate. It names a choice when, once LaTeX text macros
#     (\text{B}, \textbf{B}, \mathrm{B}, ...), "$" and "**" are taken off, it is a capital letter A-D alone or in
#     parentheses, or one followed by ")", "." or ":" and text ("B. 3e8 m/s", "(B) 3e8 m/s"); anything else
#     ("B or C", "A, C", "Bohr", "42") names none, and a last box that names none scores 0;
#   - a bare letter announced: "answer is", "Answer:", "the correct option/choice/answer is", "the correct option of",
#     "choose/select (option)", "choose <one word> X", "is option X", bold or not, followed at once by a letter that
#     ends there (end of text or line, punctuation, ")", "*", "$", "}", or a connective: "is A by considering ...",
#     "B because"; no second letter after "or", "and", "/", ","; the same letter twice is one: "C) C)", "A) A"), or
#     on the next line where the announcement ends its line with "is" or "be" ("the answer is" / "C)"), quoted or not
#     ('is "C."'); or a letter followed by "is correct" / "is the (correct) answer/option/choice" ("B is correct.",
#     "Option C is correct"). Two letters offered after an announcement ("The answer is A (C)", "answer: A or B"; not
#     three or more, which list the options) are a candidate that names none;
#   - a line that holds only a letter, possibly in parentheses, bold, "$" or \text{}, with a full stop, after a
#     list's number or not ("1) (B)"); numbered lines of different letters ("1. A." / "2. C.") are a list, not answers;
#   - a marked letter with text: "X)", "X).", "X.", "X:" or "(X)", bold or not ("X," too where it opens a line; "X."
#     followed by a sentence that names no option is a bare letter ending its sentence, not a mark), then the
#     rest of its line, at the start of a line (after a list number), after a sentence on the same line, after "is"
#     ("So this is C) ..."), or after an announcement (quoted or not: 'is "Option C: ...'). The text decides: the
#     option X's own text (case, spaces, "$", "*", quotes and final punctuation aside) up to the end of a clause
#     (punctuation, a spaced dash) names X, and so does X's text followed by "is/are correct", "is the (correct/best)
#     answer", or a rejection of another ("rather than B) ...", "and not ..."; the rejected letter is not a second one
#     offered). Short of the text: X's number without its unit ("66.7" for "66.7 Hz") where no other option has that
#     number; a long X (16 characters or more, plain) restated with a typo or a word changed (RESTATED_RATIO, no
#     other option within RIVAL_RATIO) in a clause that negates nothing; a long X's whole text going on in its
#     sentence without calling itself wrong ("... is incorrect"); or X's own short text going on in a sentence that
#     negates or rejects nothing and marks no other letter ("A) NH3 (amine) is the strongest base"); or most of X's
#     own long option, cut where a clause ends ("A) The plant ... would be genetically defective, as it ...",
#     BEGUN_SHARE), in a sentence that does not call it wrong. Another option's
#     text names none (the completion contradicts itself); other text after an announcement names none; other text
#     at a line's start is no candidate (a heading of the model's analysis). Marks of other letters on a neighbouring
#     line (a reprint of the options), or three or more letters marked with an option's text or in the options' order
#     (a walk through them), are no candidates, nor is a slip among them (a reprint that gives C the text of D
#     contradicts nothing), except a mark that opens the completion and whose letter the walk marks again (the answer
#     stated first, then a walk); an
#     announced letter whose line goes on to sentences opening with other marked letters is a list, and names none;
#   - an option's text, or its number without its unit where no other option has that number, stated as the answer
#     without its letter: after "answer is", "answer:", "the correct option/choice is" (quoted or not), or before "is
#     the correct answer/option/choice" or "is correct", ending there ("So, "1/2" is the correct answer."); or ending
#     a sentence, after "is/are" ("The best laser for visible light is an excimer laser.") or anywhere after an
#     announcement ("The answer ... falls into the category of homologous structures.", "The answer would be 360 - 2
#     = 360."), where the sentence marks no letter, negates nothing and states no other option; or a line that holds
#     only an option's text ("1/3", "1) 100 J"), unless lines hold two options' texts (a reprint).
# Without the options (a caller that has none), only boxes, announced letters and letter lines count.
# Lower-case letters never count ("a" is a word).
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_WRAPPERS = re.compile(r"[$*\s]+")
_BOXED_CHOICE = re.compile(r"\(([A-D])\)(?:\s.*)?|([A-D])(?:[.:)](?:\s.*)?)?", re.S)
# A letter ends at the end of the text or line, or at punctuation, ")", "*", "$" or "}", and no second one follows.
# A connective may follow instead: "The correct option is A by considering ...", "... is B because ...".
_JOINED = r"(?:[,/&]|\bor\b|\band\b)"  # what joins two letters offered together: "A or B", "A, C", "A/B"
_LETTER_ENDS = (
    rf"(?![ \t]*{_JOINED}[ \t]*\(?[A-D]\b)"
    r"(?=[ \t]*(?:$|[\n.,;:!?)\]}*$])|[ \t]+(?:by|because|since|as|for|which|considering)\b)"
)
_ANNOUNCEMENT = (
    r"(?i:\banswer(?:[ \t]+(?:choice|option))?(?:[^.\n]{0,30}?[ \t](?:is|should[ \t]+be|would[ \t]+be|will[ \t]+be)"
    r"(?:[ \t]+indeed)?)?|\bcorrect[ \t]+(?:option|choice)"
    r"(?:[ \t]+(?:is|of|should[ \t]+be|would[ \t]+be|will[ \t]+be))?"
    r"|\bchoos(?:e|ing)(?:[ \t]+[a-z]+(?=[ \t]+\(?[A-D]\b))?|\bselect"
    r"|\b(?:is|be)(?=[ \t]+(?:option|choice)[ \t]+[A-D]\b))"
    r"(?:[ \t]+(?:option|choice))?"
)
# An announcement that ends its line with "is" or "be" reaches the next line ("the answer is" / "C) ...").
_NEXT_LINE = r"(?:(?<=\bis|\bbe)[ \t]*\n)?"
_ANNOUNCED = re.compile(
    _ANNOUNCEMENT
    + _NEXT_LINE
    + r"[ \t]*:?[ \t]*(?:\*\*)?[ \t]*:?[ \t]*[$\"“]?[ \t]*(?:\\text(?:bf)?\{[ \t]*)?\(?([A-D])\)?+(?:[ \t]+\(?\1\)?)?"
    + _LETTER_ENDS,
    re.M,
)
# Two letters offered where one was announced ("The answer is A (C)", "answer: A or B"): a final statement that names
# none, so a letter stated before it is no longer the answer; three or more list the options ("Choose A, B, C, or D").
_TWO_OFFERED = re.compile(
    _ANNOUNCEMENT + rf"[ \t]*:?[ \t]*(?:\*\*)?[ \t]*\(?([A-D])\)?[ \t]*{_JOINED}?[ \t]*\(?(?!\1)[A-D]\b"
    rf"(?![ \t]*\)?[ \t]*{_JOINED}[ \t]*\(?[A-D]\b)",
    re.M,
)
_ENDORSED = r"[ \t]+(?:is|are)[ \t]+(?:the[ \t]+)?(?:correct|right|best)\b|[ \t]+is[ \t]+the[ \t]+answer\b"
_LETTER_ENDORSED = re.compile(r"(?<![\w(])(?:(?i:option|answer|choice)[ \t]+)?\(?([A-D])\)?" + _ENDORSED)
_LIST_NUMBER = r"(?:\d+[.)][ \t]+)?"  # "1) (B)": a list's number before what the line says
_LETTER_LINE = re.compile(
    r"^[ \t*$]*(?P<number>" + _LIST_NUMBER + r")(?:\\text(?:bf)?\{)?\(?(?P<letter>[A-D])\)?\}?\.?[ \t*$]*$", re.M
)
# A marked letter and the rest of its line; `announced` is set when an announcement stands right before it.
_MARKED = re.compile(
    r"(?P<where>^[ \t]*(?:[-•]|\d+[.)])?|(?<=[.!?])[ \t]+|(?P<is>(?<=\bis)[ \t]+)|(?P<announced>"
    + _ANNOUNCEMENT
    + r")"
    + _NEXT_LINE
    + r"[ \t]*:?[ \t]*[\"“]?(?:(?i:option|choice)[ \t]+)?)"
    r"[ \t]*(?:\*\*)?[ \t]*(?:\((?P<bracketed>[A-D])\)"
    r"|(?P<letter>[A-D])(?:\)\.?|(?P<stop>\.)|:|(?P<comma>,)(?=[ \t]+(?![A-D]\b)\w)))"
    r"(?:\*\*)?(?=(?P<text>[^\n]*))",
    re.M,
)


def _plain(text: str) -> str:
    """Text as compared with an option's: LaTeX text macros, "$", "*", quotes, spaces, case, final punctuation off."""
    text = _TEXT_MACRO.sub(r"\1", text)
    return re.sub(r"[\s$*`\"“”'‘’]+", "", text).lower().rstrip(".,;:!")


def _boxed_choice(content: str | None) -> str | None:
    if content is None:
        return None
    content = _WRAPPERS.sub(" ", _TEXT_MACRO.sub(r"\1", content)).strip()
    match = _BOXED_CHOICE.fullmatch(content)
    return (match.group(1) or match.group(2)) if match else None


# What rejects the option after it: "A) weathering rather than B) ...", "D) 66.7 and not D) 42.4".
_REJECTION = r"[ \t]+(?:rather[ \t]+than|instead[ \t]+of|and[ \t]+not|but[ \t]+not)\b"
_CLAUSE_ENDS = re.compile(r"[,;:!?]|\.(?=\s|$)|[ \t]+[-–—][ \t]|" + _ENDORSED + "|" + _REJECTION + r"|$")
_SELF_ENDORSED = re.compile(r"(?i)(?:this[ \t]+)?(?:is|are)[ \t]+(?:the[ \t]+)?(?:correct|right|answer)\b")
_NUMBER = re.compile(r"[-+−]?\d+(?:\.\d+)?")
_UNIT = re.compile(r"[a-zµμωΩ°%][\w/^·°\-]*")
LONG_OPTION_CHARS = 16  # an option this long (plain) can be read through a slip or a reworded word
# How close (difflib's ratio of the plain texts) a long option's restatement must come: one typo in a 16-character
# option is 0.94, "has segmented bodies" for "have segmented bodies" 0.92, "... DNA that produces a polypeptide chain"
# for "... DNA that codes for a polypeptide chain" 0.95; a changed key phrase ("Plant trees and measure subsequent leaf
# damage" for "Remove ants and ...") 0.85. No other option may come within RIVAL_RATIO: options that differ by a word
# or two ("Protons and neutrons have orbital and spin ..." / "... possess orbital ... only") leave a restatement between
# them unread.
RESTATED_RATIO = 0.9
RIVAL_RATIO = 0.8


def _similarity(stated: str, option: str) -> float:
    matcher = difflib.SequenceMatcher(None, stated, option, autojunk=False)
    return matcher.ratio() if matcher.real_quick_ratio() >= RIVAL_RATIO else 0.0


def _unit_number(option: str) -> str | None:
    """The number of an option (plain) that is a number and a unit ("66.7" of "66.7hz"), else None."""
    number = _NUMBER.match(option)
    return number.group() if number and _UNIT.fullmatch(option[number.end() :]) else None


def _loosely_named(stated: str, options: dict[str, str]) -> str | None:
    """The letter of the one option that ``stated`` (plain) is short of what a model drops or slips: the option's
    number without its unit ("66.7" for "66.7 Hz"), or a long option restated with a typo or a word changed; or
    None."""
    numbers = [letter for letter, option in options.items() if _unit_number(option) == stated]
    if numbers:
        return numbers[0] if len(numbers) == 1 else None
    similarity = {letter: _similarity(stated, option) for letter, option in options.items()}
    best = max(similarity, key=similarity.get)
    rivals = [letter for letter, ratio in similarity.items() if letter != best and ratio >= RIVAL_RATIO]
    long = len(options[best]) >= LONG_OPTION_CHARS
    return best if long and similarity[best] >= RESTATED_RATIO and not rivals else None


def _named_option(text: str, options: dict[str, str]) -> str | None:
    """The letter whose option ``text`` states: the option's text up to the end of a clause (punctuation, an
    endorsement such as "is correct", a rejection such as "rather than", or the line's end), the longest such when
    several fit; else, with no option stated exactly, the one option stated loosely (`_loosely_named`) in a clause
    that negates nothing ("D. They possess cell walls composed of peptidoglycan is false" restates no option); or
    None."""
    named = loose = None
    for end in _CLAUSE_ENDS.finditer(text):
        stated = _plain(text[: end.start()])
        letters = [letter for letter, option in options.items() if stated == option]
        if len(letters) == 1:
            named = letters[0]
        if _NEGATION.search(text[: end.start()]):
            continue
        loose = _loosely_named(stated, options) or loose
    return named or loose


def _marked_candidates(text: str, options: dict[str, str]) -> list[tuple[int, str | None]]:
    """Marked letters with text (the rule above): (where, letter or None), reprints of the options left out."""
    found, unannounced = [], []
    for match in _MARKED.finditer(text):
        letter, bracketed = match.group("bracketed") or match.group("letter"), match.group("bracketed") is not None
        rest = re.sub(rf"^[ \t]*\(?{letter}(?:[).:]|\b(?=[ \t.]*$))", "", match.group("text")).strip()  # "A) A)": one
        announced = match.group("announced") is not None
        if match.group("comma") and (announced or text[: match.start()].rstrip(" \t")[-1:] not in ("", "\n")):
            continue  # "A, the process is exothermic." opens a line; "The answer is A, which ..." is a bare letter
        named = _named_option(rest, options) or _leading_option(rest, options, letter)
        named = letter if _SELF_ENDORSED.match(rest) else named
        line = text.count("\n", 0, match.start())
        stated = match.group("is") is not None  # "So this is C) ...": a statement, never a reprint's line
        if not announced and not stated:
            unannounced.append((line, letter, named is not None))  # "B. Foo" opening a line still marks a list
        if not _plain(rest):  # a bare marked letter: the letter rules above read it where it counts
            continue
        if match.group("stop") and named is None and re.match(r"[ \t]+[A-Z]", match.group("text")):
            continue  # "... the correct answer D. The answer for ...": a full stop after a bare letter, not a mark
        where = None if announced or stated else line  # where a mark may belong to a reprint of the options
        if named == letter and announced and _another_letter(rest, letter):  # "A) x, and the correct answer, C) y"
            found.append((match.start(), None, letter, None))
        elif named == letter:
            found.append((match.start(), letter, letter, where))
        elif announced and bracketed and named is None and not _SECOND_LETTER.match(rest):  # "is (C) which ..."
            found.append((match.start(), letter, letter, None))
        elif named is not None or announced:  # a contradiction, unless it is a reprint's slip ("C) 1.661 s" twice)
            found.append((match.start(), None, letter, where))
    opening = text.count("\n", 0, len(text) - len(text.lstrip()))  # the line of the completion's first word
    return [
        (start, read)
        for start, read, letter, line in found
        if line is None or not _reprint(line, letter, unannounced, opening)
    ]


_SECOND_LETTER = re.compile(rf"[ \t]*(?:{_JOINED}[ \t]*)?\(?[A-D]\b")  # "(A) and (B)", "(A) B."


def _another_letter(text: str, letter: str) -> bool:
    """Whether the sentence that ``text`` begins marks a letter other than ``letter``, or a later sentence of its line
    begins with one ("The answer is: A) x. B) y and C) z" lists the options; "... is D) x. Receptors (A) also ..."
    only mentions one)."""
    sentence = re.split(r"\.(?:\s|$)|" + _REJECTION, text, maxsplit=1)[0]  # a rejected letter is not offered
    marked = re.findall(r"(?<![\w\[(])\(?([A-D])\)", sentence) + re.findall(r"[.!?][ \t]+\(?([A-D])\)", text)
    return any(other != letter for other in marked)


def _reprint(line: int, letter: str, marks: list[tuple[int, str, bool]], opening: int) -> bool:
    """Whether an unannounced marked letter belongs to a reprint or a walk through the options: another letter is
    marked on the same or a neighbouring line, or three or more letters are marked with an option's text, or three or
    more letters are marked in the options' order ("A) ... B) ... C) ...", blank lines between); but a mark
    that opens the completion and whose letter the walk marks again on its own line is a statement of the answer
    before the walk ("D) 1.661 s", then steps, then "A) ... B) ... C) ... D) ...")."""
    beside = any(abs(other_line - line) <= 1 and other != letter for other_line, other, _ in marks)
    stated_first = line == opening and any(other == letter and other_line != line for other_line, other, _ in marks)
    order = list(dict.fromkeys(other for _, other, _ in marks))  # the letters in the order they are first marked
    walked = len({other for _, other, states in marks if states}) >= 3 or (len(order) >= 3 and order == sorted(order))
    return beside or (not stated_first and walked)


def _spelled(option: str) -> str:
    """A pattern for an option's plain text as a model writes it: any case (the caller's flag), any spaces."""
    return r"[ \t]*".join(re.escape(character) for character in option.replace(" ", ""))


# Words that call what they follow wrong ("A) ... is incorrect"), and any negation or rejection in a sentence.
_DISMISSED = re.compile(r"(?i)\b(?:incorrect|wrong|false|not[ \t]+(?:the[ \t]+)?(?:correct|right|answer|true|valid))\b")
_NEGATION = re.compile(
    r"(?i)\b(?:not|no|never|neither|nor|cannot|rather|instead|unlike|incorrect|wrong|false|too|impossible|unlikely)\b"
    r"|n't\b"
)  # "too" rejects by excess: "B) 3e8 m/s is too fast for a sound wave"
_SENTENCE_END = r"[.!?](?=\s|$)"
_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?!\s|$))+", re.M)
# A letter marked or named as a choice in a sentence ("(B)", "B)", "B.", "option B"); "A rise in ..." is a word.
_LETTER_MARK = re.compile(r"\(?\b[A-D]\)|(?<![\w.])[A-D][.:](?!\w)|(?i:option|choice|answer)[ \t]+[A-D]\b")


_GOES_ON = r"[ \t]+(?:\([^()\n]*\)[ \t]+)?[\w=]"  # more words or "=", after a parenthesis or not: "NH3 (amine) is"


def _leading_option(text: str, options: dict[str, str], marked: str) -> str | None:
    """The letter of the one option whose whole text begins ``text`` and goes on in the same sentence: a long option
    that does not call itself wrong ("A) The entire genetic information possessed by the original zygote is typically
    not found in ..."), or the ``marked`` letter's own short option in a sentence that negates nothing and marks no
    other letter ("A) NH3 (amine) is the strongest base", "C) 4k refers to 4K, ..."; a short text begins too many
    sentences to name another letter's option); or None."""
    sentence = re.split(_SENTENCE_END, text, maxsplit=1)[0]
    letters = []
    for letter, option in options.items():
        long = len(option) >= LONG_OPTION_CHARS
        if (long or letter == marked) and re.match(_spelled(option) + _GOES_ON, sentence, re.I):
            called_wrong = _DISMISSED.search(sentence) if long else _NEGATION.search(sentence)
            if not called_wrong and (long or not _another_letter(sentence, letter)):
                letters.append(letter)
    if not letters and not _DISMISSED.search(sentence):
        letters = [letter for letter in _begun_options(sentence, options) if letter == marked]
    return letters[0] if len(letters) == 1 else None


# A long option's beginning, cut where a clause ends, then the model's own reason: "A) The plant with the double
# chromosome number would be genetically defective, as it ..." or "... defective because of ..." for "The plant with
# the double chromosome number would be genetically defective and have no descendants." The words kept must be most of
# the option and begin no other option; words changed inside the clause ("Remove ants and measure subsequent growth")
# are another statement.
BEGUN_SHARE = 0.6
BEGUN_CHARS = 24
_CLAUSE_BREAK = r"(?=[ \t]*[,;:(–—]|[ \t]+(?:because|as|since|which|due|given|so)\b)"


def _begun_options(sentence: str, options: dict[str, str]) -> list[str]:
    """The letters of the options whose leading words, at least BEGUN_SHARE of the option and BEGUN_CHARS long (plain),
    begin ``sentence`` up to a clause's end and begin no other option."""
    begun = set()
    for end in re.finditer(r"(?<=\w)" + _CLAUSE_BREAK, sentence):
        stated = _plain(sentence[: end.start()])
        starts = [letter for letter, option in options.items() if option.startswith(stated)]
        if len(starts) == 1 and len(stated) >= max(BEGUN_CHARS, BEGUN_SHARE * len(options[starts[0]])):
            begun.add(starts[0])
    return sorted(begun)


def _stated(option: str, options: dict[str, str]) -> str:
    """A pattern for an option stated as the answer: its text (`_spelled`), or its number alone where it is a number
    with a unit and no other option has that number ("360" for "360 m")."""
    number = _unit_number(option)
    leading = [match.group() for match in map(_NUMBER.match, options.values()) if match]  # bare numbers count too
    if number is None or leading.count(number) > 1:
        return _spelled(option)
    return rf"(?<![\d.]){re.escape(number)}(?![\d.])(?:[ \t]*{_spelled(option[len(number) :])})?"


def _stated_option_text(text: str, options: dict[str, str]) -> list[tuple[int, str]]:
    """Options stated as the answer by their text alone: after an announcement or before an endorsement; or ending a
    sentence that announces the answer ("The answer to this question falls into the category of homologous
    structures.") or says what something is ("The best laser for ... is an excimer laser."), where that sentence
    marks no letter, negates nothing and states no other option; or holding a line alone (`_option_lines`)."""
    found, stated = [], {letter: _stated(option, options) for letter, option in options.items()}
    for letter in options:
        quoted = rf"[\"“']?{stated[letter]}[\"”']?"
        after = rf"(?:{_ANNOUNCEMENT})[ \t]*:?[ \t]*"
        pattern = rf"{after}{quoted}(?=[ \t]*(?:$|[.,;!]))|(?<![\w/]){quoted}(?={_ENDORSED})"
        found += [(match.start(), letter) for match in re.finditer(pattern, text, re.M | re.I)]
    for sentence in _SENTENCE.finditer(text):
        words = sentence.group()
        if len(words) > MAX_ANSWER_CHARS or _LETTER_MARK.search(words) or _NEGATION.search(words):
            continue
        ending = [letter for letter, pattern in stated.items()
                  if re.search(rf"(?:\b(?:is|are)[ \t]+|(?:{_ANNOUNCEMENT})\b.*[ \t])(?:(?:an?|the)[ \t]+)?"
                               rf"{pattern}[ \t\"”']*$", words, re.I)]  # fmt: skip
        mentioned = [letter for letter, pattern in stated.items() if re.search(pattern, words, re.I)]
        if len(ending) == 1 and mentioned == ending:
            found.append((sentence.start(), ending[0]))
    return found + _option_lines(text, options)


def _option_lines(text: str, options: dict[str, str]) -> list[tuple[int, str]]:
    """Lines that hold only one option's text (after a list's number, bold or not: "1/3", "1) 100 J"), unless lines
    hold two options' texts (a reprint of the options without their letters, or a walk through them). An option that
    is a bare integer is not read this way: a line holding only "1" or "82" is as often a step's number or a count."""
    stated = []
    for line in re.finditer(r"^.*$", text, re.M):
        plain = _plain(re.sub(r"^[ \t*]*" + _LIST_NUMBER, "", line.group()))
        letters = [letter for letter, option in options.items() if plain == option and not option.isdigit()]
        if len(letters) == 1:
            stated.append((line.start(), letters[0]))
    return stated if len({letter for _, letter in stated}) == 1 else []


def _letter_lines(text: str) -> list[tuple[int, str]]:
    """Lines that hold only a letter; numbered lines that give different letters ("1. A." / "2. C." / "3. B.") are a
    list of letters, not an answer, and none of them counts."""
    matches = list(_LETTER_LINE.finditer(text))
    lines = [(match.start(), match.group("letter"), bool(match.group("number"))) for match in matches]
    listed = len({letter for _, letter, numbered in lines if numbered}) >= 2
    return [(start, letter) for start, letter, numbered in lines if not (numbered and listed)]


def extract_letter(completion: str, choices=None) -> str | None:
    """The letter A-D the completion gives last, or None (the rule above). ``choices``: the question's four options."""
    text = tail(completion)
    candidates = [(start, _boxed_choice(content)) for start, content in boxes(text)]
    candidates += [(match.start(), match.group(1)) for match in _ANNOUNCED.finditer(text)]
    candidates += [(match.start(), match.group(1)) for match in _LETTER_ENDORSED.finditer(text)]
    candidates += _letter_lines(text)
    candidates += [(match.start(), None) for match in _TWO_OFFERED.finditer(text)]
    if choices:  # after the others: where both read one place, the reading that checked the option's text wins
        options = {letter: _plain(str(option)) for letter, option in zip("ABCD", choices, strict=False)}
        candidates += _marked_candidates(text, options) + _stated_option_text(text, options)
    return sorted(candidates, key=lambda candidate: candidate[0])[-1][1] if candidates else None


def multiple_choice_reward(completion: str, gold: str, choices=None) -> float:
    return float(extract_letter(completion, choices) == gold.strip().upper())
