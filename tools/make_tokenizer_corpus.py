#!/usr/bin/env python3
"""Writes tests/testdata/tokenizer/corpus.jsonl: the tokenizer golden corpus (one {"text": ...} per
line). Deterministic; the hand-written fragments below cover the cases where byte-level BPE
tokenizers tend to disagree: scripts, marks, emoji sequences, whitespace runs, digits, contractions,
added tokens written literally, NFC/NFD forms and the Qwen2-vs-Qwen3.5 regex difference (marks).
Usage: tools/make_tokenizer_corpus.py [OUT]"""
import json
import sys
import unicodedata

PROSE = [
    "Hello, world!",
    "The capital of France is",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "Machine learning models are trained on large datasets; fine-tuning adapts them to new tasks.",
    "Dr. Smith's patients weren't happy—they'd waited 3 hours!",
    "E-mail me at john.doe@example.com or visit https://example.org/path?q=1&r=2#frag.",
    "Prices: $19.99, €5,00, £3.50, ¥1200 and ₹450.",
    "She said, \"I can't believe it's already 2024.\"",
    "Q: What's 2+2? A: It's 4.",
    "Mr. O'Neil lives at 221B Baker Street, London NW1 6XE.",
    "Fine-tuning a 27B-parameter model needs ~54 GB of bf16 weights.",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND SYMBOLS #@!",
    "snake_case_identifier and camelCaseIdentifier and kebab-case-identifier",
    "Ellipsis… em-dash— en-dash– and ‘curly’ “quotes”.",
    "naïve café résumé coöperate façade jalapeño",
    "Ångström, Øresund, Ærø, Straße, ĳssel, ŉ",
]
CJK = [
    "你好，世界！",
    "中华人民共和国成立于1949年10月1日。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "我今天去商店买了三个苹果和两瓶牛奶。",
    "「引号」和『书名号』以及《书名》",
    "こんにちは、世界！",
    "東京は日本の首都です。人口は約1400万人です。",
    "カタカナとひらがなと漢字が混ざった文章です。",
    "ｶﾞｷﾞｸﾞ 半角カナ ﾃｽﾄ",
    "안녕하세요, 세계!",
    "대한민국의 수도는 서울입니다.",
    "한국어 문장은 띄어쓰기를 사용합니다.",
    "Mixed 中文 and English 和日本語 text.",
]
OTHER_SCRIPTS = [
    "مرحبا بالعالم!",
    "اللغة العربية هي لغة سامية.",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ",
    "שלום עולם",
    "Привет, мир! Как дела?",
    "Москва — столица России.",
    "Γειά σου Κόσμε! Ελληνικά.",
    "नमस्ते दुनिया",
    "हिन्दी भारत की राजभाषा है।",
    "क्षत्रिय ज्ञान श्री",
    "தமிழ் மொழி",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "Tiếng Việt có dấu: Xin chào, tôi tên là Nguyễn.",
    "Đây là một câu tiếng Việt với nhiều dấu thanh: ả ã ạ ấ ầ ẩ ẫ ậ.",
    "ქართული ენა",
    "Հայերեն",
    "አማርኛ",
    "Türkçe: İstanbul, ığdır, şeker, çiçek.",
    "Polski: zażółć gęślą jaźń.",
    "Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
]
CODE = [
    "#include <vector>\nint main() {\n    std::vector<int> v{1, 2, 3};\n    return v.size();\n}\n",
    "template <typename T>\nT add(T a, T b) { return a + b; }",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "auto it = std::find_if(v.begin(), v.end(), [](int x) { return x > 0; });",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo:\n\tdef __init__(self):\n\t\tself.x = 1\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)",
    "    # indented comment\n    pass",
    "{\"name\": \"qwen\", \"layers\": 64, \"tie\": false, \"ids\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>",
    "$ git commit -m \"fix: off-by-one\" && git push origin main",
    "x <<= 2; y >>= 3; z != w; a && b || !c; p->q; ::std::move(r);",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "if err != nil {\n\treturn fmt.Errorf(\"failed: %w\", err)\n}",
    "const f = async (x) => { await g(x ?? 0); };",
    "0x7fffffff 0b1010 1e-9 3.14159f 1'000'000",
]
EMOJI = [
    "I love 🍕 and 🍣!",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
    "Family: 👨‍👩‍👧‍👦 and 👩‍❤️‍👨",
    "Flags: 🇺🇸🇫🇷🇯🇵🇨🇳 🏳️‍🌈 🏴‍☠️",
    "Keycaps: 1️⃣ 2️⃣ #️⃣",
    "Professions: 👩🏽‍💻 🧑🏿‍🚀 👨🏻‍🍳",
    "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇",
    "❤️ vs ❤ (with and without VS16)",
    "text🙂text 🙂 text",
    "🤷‍♂️🤷‍♀️",
]
MARKS = [
    "e\u0301",
    "cafe\u0301",
    "\u0301!I",
    "a\u0300\u0301\u0302\u0303",
    "A\u030a and \u212b and \u00c5",
    "\u1100\u1161\u11a8 (conjoining jamo)",
    "n\u0303o",
    "x\u0301y\u0302z",
    "Zalgo: H\u0335\u0321e\u0337\u0322l\u0336l\u0334o\u0338",
    "'\u0301s 's'\u0301",
    " \u0301 \u0301\u0301",
    "\u0301",
    "\u0915\u093f\u0924\u093e\u092c",
    "Vie\u0302\u0323t Nam",
    "ab\u0327c",
    "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
    "\u0e01\u0e34\u0e19\u0e02\u0e49\u0e32\u0e27",
    "1\u20e3 2\u20e3",
    "x\u0308\u0304",
    "\u0041\u030a\u0301",
    "\u00e9 vs e\u0301 vs \u0065\u0301\u0301",
    "\u0958 \u0915\u093c",
    "\uf900 \u2126 \u212a",
    "\ufb01 \u2460 \u00bd \u00b2",
]
NUMBERS = [
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "Year 2024, month 12, day 31.",
    "٠١٢٣٤٥٦٧٨٩ (Arabic-Indic digits)",
    "१२३४ (Devanagari digits)",
    "①②③ ⅠⅡⅢ ½¾ ²³",
    "12,345,678.90",
    "+1 (555) 123-4567",
    "0" * 200,
    "9" * 57 + "1",
    "v1.2.3-rc.4+build.567",
]
SPACES = [
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "\t",
    "\t\ttabs\tin\ttext\t",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "line1\nline2\n",
    "line1\r\nline2\r\n",
    "\r\n\r\n\r\n",
    "\r\r\n\n\r",
    " \n \n ",
    "word \n\n  next",
    "mixed \t \n\t whitespace \r\n  ",
    "a\u00a0b\u00a0\u00a0c",
    "ideographic\u3000space\u3000\u3000end",
    "nel\u0085char",
    "mongolian\u180evowel",
    "zero\u200bwidth\u200cjoiner\u200d",
    "line\u2028sep\u2029para",
    "thin\u2009space\u202fnarrow",
    "vt\x0bff\x0c",
    " " * 64,
    "\n" * 33,
    " \t" * 20,
    "end with newline\n",
    "x" + " " * 10 + "y",
    "   \n   ",
    "\u3000\u3000",
]
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "text<|im_end|>text",
    "text <|im_end|> text",
    "text<|endoftext|>",
    "<|endoftext|><|endoftext|>",
    "<|im_start|><|im_end|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<think></think>",
    "a<think>b</think>c",
    " <think> ",
    "<thinking> is not <think>",
    "<|im_start",
    "im_start|>",
    "<|im_end|",
    "<<|im_end|>>",
    "<|<|im_end|>|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<tool_response>ok</tool_response>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|>",
    "<|file_sep|>path/to/file.py\n<|repo_name|>qwentune",
    "Use <|im_start|> to begin a turn and <|im_end|> to end it.",
    "e\u0301<|im_end|>\u0301",
    "\n<|im_end|>\n",
    "  <|im_end|>  ",
    "<|IM_END|> <|Im_End|>",
    "<|box_start|>(10,20),(30,40)<|box_end|>",
    "<|object_ref_start|>the cat<|object_ref_end|>",
    "<|quad_start|><|quad_end|><|video_pad|><|vision_pad|>",
]
CONTRACTIONS = [
    "it's don't we're they've I'm you'll he'd",
    "IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D",
    "It'S DoN'T We'Re THEY'Ve I'm YOU'LL He'D",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "''s '''t 'x 'ss",
    "rock'n'roll o'clock y'all ma'am",
    "the dog's bone, the dogs' bones",
    "'ſ and 'ſt (long s)",
    "\u2019s curly apostrophe: it\u2019s don\u2019t",
    "'123 '  's",
]
PUNCT = [
    "!!!???...,,,;;;:::",
    "(((nested [brackets] {braces})))",
    "--- *** ___ === +++ ~~~ ^^^",
    "a.b.c.d/e/f\\g\\h",
    "100% of 50% is 25%.",
    "@user #hashtag $var %mod &ref *ptr",
    "»guillemets« ¿Qué? ¡Hola!",
    "。、！？「」",
    "|||\\\\///",
    "....\n....\n",
    "!\n!\r\n!\n\n",
    " ?\n",
]
MISC = [
    "",
    "a",
    "A",
    "I",
    ".",
    "x" * 300,
    "ab" * 150,
    "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtsgesellschaftskapitän",
    "\u00ff\u00fe\u00fd",
    "\U0001d400\U0001d401\U0001d402 mathematical bold",
    "\U00020000\U0002a6d6 CJK extension B",
    "\ue000 private use \U000f0000",
    "\ufeffBOM at start",
    "\ufffd replacement char",
    "soft\u00adhyphen",
    "RTL\u200fmark\u200eLTR",
    "\x01\x02\x1f control chars \x7f",
    "tab\there",
]


def variants():
    """Systematic combinations: prefixes/suffixes around interesting cores."""
    cores = ["hello", "Hello", "世界", "e\u0301", "123", "'s", "<|im_end|>", "🙂", "\u0301", "x\u0301"]
    seps = [" ", "", "\n", "  ", "\t", "\r\n"]
    out = []
    for c in cores:
        for s in seps:
            out.append(s + c + s)
            out.append(c + s + c)
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/testdata/tokenizer/corpus.jsonl"
    lines = PROSE + CJK + OTHER_SCRIPTS + CODE + EMOJI + MARKS + NUMBERS + SPACES + SPECIAL + CONTRACTIONS + PUNCT + MISC
    # NFC-vs-NFD: every non-ASCII prose/script line again, decomposed.
    for t in PROSE + CJK + OTHER_SCRIPTS + MARKS:
        d = unicodedata.normalize("NFD", t)
        if d != t:
            lines.append(d)
    lines += variants()
    # A long mixed paragraph.
    lines.append(" ".join(PROSE + CJK[:4] + OTHER_SCRIPTS[:6] + EMOJI[:3]))
    seen, uniq = set(), []
    for t in lines:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for t in uniq:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    print(f"wrote {len(uniq)} lines to {out}")


if __name__ == "__main__":
    main()
