"""SGLang's classic frontend programs, written once against the language's API and built
for a given implementation of it: `radixjax.lang`, or SGLang's own `sglang` package (the
same programs run unchanged on both)."""

from __future__ import annotations

import json
from types import ModuleType, SimpleNamespace

FEW_SHOT = ("The following are questions with answers.\n"
            "Q: What is the capital of France?\nA: Paris\n"
            "Q: What is the capital of Germany?\nA: Berlin\n"
            "Q: What is the capital of Italy?\nA: Rome\n")
CITIES = {"Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo", "Russia": "Moscow"}
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
IP_REGEX = r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])"


def build(sgl: ModuleType) -> SimpleNamespace:
    @sgl.function
    def few_shot_qa(s, question):
        s += FEW_SHOT
        s += "Q: " + question + "\nA:" + sgl.gen("answer", stop="\n", max_tokens=16)

    @sgl.function
    def multi_turn_chat(s, question_1, question_2):
        s += sgl.system("You are a helpful assistant.")
        s += sgl.user(question_1)
        s += sgl.assistant(sgl.gen("answer_1", max_tokens=24))
        s += sgl.user(question_2)
        s += sgl.assistant(sgl.gen("answer_2", max_tokens=24))

    @sgl.function
    def capital(s, country, choices):
        s += "The capital of " + country + " is" + sgl.select("city", choices=choices)

    @sgl.function
    def tip_suggestion(s, topic):
        s += ("Here are two tips for staying healthy: "
              "1. Balanced Diet. 2. Regular Exercise. These tips are about " + topic + ".\n\n")
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Now, expand tip {i + 1} into a paragraph:\n"
            f += sgl.gen("detailed_tip", max_tokens=20, stop="\n\n")
        s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
        s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
        s += "In summary" + sgl.gen("summary", max_tokens=12)

    @sgl.function
    def regex_and_json(s):
        s += "Q: What is the IP address of the Google DNS servers?\nA: "
        s += sgl.gen("ip", regex=IP_REGEX, temperature=0, max_tokens=24)
        s += "\nHere is a person as JSON: "
        s += sgl.gen("person", json_schema=json.dumps(PERSON), max_tokens=48)

    @sgl.function
    def arithmetic(s):
        s += "Q: What is 2 + 2?\nA: 4\nQ: What is 3 + 4?\nA:" + sgl.gen("sum", dtype=int)

    @sgl.function
    def typed_answers(s):
        s += "Q: What is pi to two decimals?\nA:" + sgl.gen("pi", dtype=float)
        s += "\nQ: Is water wet? Answer True or False.\nA:" + sgl.gen("wet", dtype=bool)
        s += "\nQ: Name a fruit, in quotes.\nA:" + sgl.gen("fruit", dtype=str)
        s += "\nQ: Which is a colour?\nA:" + sgl.gen("colour", choices=[" red", " table"])

    @sgl.function
    def parallel_branches(s, countries):
        s += FEW_SHOT
        forks = s.fork(len(countries))
        for f, c in zip(forks, countries, strict=True):
            f += "Q: What is the capital of " + c + "?\nA:"
            f += sgl.gen("answer", stop="\n", max_tokens=12)
        forks.join()

    return SimpleNamespace(**{f: v for f, v in locals().items() if f != "sgl"})
