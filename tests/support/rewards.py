"""A ``python:`` reward module whose functions fail in each way a reward can (its source, to
write to a file): ``raises`` divides by zero, ``text`` returns a string, ``nan`` returns NaN;
``good`` scores an exact answer; ``examples()`` gives 40 prompts."""

FAILING_REWARDS = """
def examples():
    return [{"prompt": f"{i}=", "answer": str(i)} for i in range(40)]

def raises(prompt, completion, answer):
    return 1 / 0

def text(prompt, completion, answer):
    return "high"

def nan(prompt, completion, answer):
    return float("nan")

def good(prompt, completion, answer):
    return float(completion == answer)
"""
