"""The prompt sets of the speculative decoding benchmarks (bench/serving/speculative.py through
the server, bench/engine/spec_ab.py in process): `grounded`, answers that repeat their input
(rewrite, quote, code edit, JSON echo), where drafts taken from the prompt are often right;
`grounded-more`, 8 more such prompts; `chat`, open questions, where they rarely are. `SETS` maps
each set's name to its prompts."""

from __future__ import annotations

PARAGRAPH = (
    "The comittee met on tuesday to discuss the new libary. Several members beleived the budget was "
    "to small, and they argued that the building should be finished before the begining of winter. "
    "In the end, the proposal was accepted with a few minor changes to the shedule."
)
TEXT = (
    "Rivers shape the land they cross. Over thousands of years they carve valleys and carry soil to "
    "the sea.\n\nA river's delta forms where it slows down and drops the sand and mud it carries. "
    "Deltas are often rich farmland.\n\nFloods are part of a river's life. They renew the soil but "
    "can also destroy towns built too close to the banks."
)
CODE = (
    "def mean(values):\n    x = 0\n    for v in values:\n        x = x + v\n    if len(values) == 0:\n"
    "        return 0\n    return x / len(values)\n"
)
RECORD = (
    '{"name": "Ada Lovelace", "age": 36, "city": "London", "languages": ["English", "French"], '
    '"active": true}'
)

GROUNDED = [
    "Rewrite the following paragraph, fixing the spelling mistakes and keeping everything else the "
    f"same:\n\n{PARAGRAPH}",
    f"Quote the second paragraph of this text word for word:\n\n{TEXT}",
    f"Rename the variable x to total in this function and return the whole function:\n\n```python\n{CODE}```",
    "Here is a JSON record. Return the same record with the age increased by one, and nothing "
    f"else:\n\n{RECORD}",
]
# More input-grounded prompts, held out from tuning the draft length policy (core/spec/draft_length.py):
# with only four, one greedy answer that changes with the kernels' rounding (the code edit's, on
# 2026-12-03) moves the set's ratio by ~15 %.
GROUNDED_MORE = [
    "Correct the grammar in this sentence and return it: 'Me and him goes to the store every days "
    "because we needs milk and breads.'",
    "Copy this list exactly, then add 'pears' at the end:\n- apples\n- bananas\n- cherries\n- dates\n- figs",
    "Translate this Python to use a list comprehension and return the full code:\n\n```python\n"
    "result = []\nfor n in numbers:\n    if n % 2 == 0:\n        result.append(n * n)\n```",
    "Here is an address. Return it as JSON with keys street, city, zip:\n\n"
    "221B Baker Street, London, NW1 6XE",
    "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
    "Rewrite this email in a more polite tone, keeping the details:\n\nSend me the report by Friday. "
    "I need the sales numbers for March and April and the list of new clients.",
    "Change every 'cat' to 'dog' in this text: The cat sat on the mat. The cat was happy. Another cat "
    "came and the two cats played.",
    "Return this JSON with the field 'status' set to 'done' and nothing else: "
    '{"id": 17, "title": "Write report", "status": "open", "tags": ["work", "urgent"]}',
]
CHAT = [
    "Tell me a short story about a lighthouse keeper.",
    "What are some good habits for staying healthy?",
    "Explain how rainbows form.",
    "Give me three ideas for a birthday party.",
]
SETS = {"grounded": GROUNDED, "grounded-more": GROUNDED_MORE, "chat": CHAT}
