"""Mandarin voice-command grammar, the counterpart of `grammar_en`, with its own pinyin.

References are Chinese characters with numbers as Chinese numerals (拨打五五五一二三四, 七点半).
espeak-ng's plain `cmn` voice is broken in Debian's build (it reads tone digits in English), so the
TTS engine is given tone-numbered pinyin for its `cmn-latn-pinyin` voice. The pinyin comes from a
hand-written table for this small vocabulary: a per-character default reading, overridden for
whole words where the reading depends on context (neutral tones, 一 sandhi, 倒 in 倒计时). espeak-ng
applies third-tone sandhi itself, so the tables give citation tones.
"""
from __future__ import annotations

import numpy as np

from asr_rl.data.synth.sentence import Sentence, pick

NAMES = ("张伟", "王芳", "李娜", "刘洋", "陈静", "杨明", "赵磊", "黄丽", "周杰", "吴敏", "孙强", "林晓",
         "妈妈", "爸爸")
ROOMS = ("客厅", "卧室", "厨房", "书房", "卫生间", "阳台", "餐厅", "儿童房", "车库")
DEVICES = ("灯", "台灯", "空调", "电视", "风扇", "窗帘", "热水器", "音箱", "加湿器", "洗衣机")
MESSAGES = ("晚饭好了", "我马上到", "生日快乐", "回个电话")
WHEN = ("", "", "明天", "明天早上", "早上", "下午", "晚上")
DIGITS = "零一二三四五六七八九"

# Default reading of every character the grammar can produce.
CHAR_PINYIN = {
    # numbers and time
    "零": "ling2", "一": "yi1", "二": "er4", "两": "liang3", "三": "san1", "四": "si4", "五": "wu3",
    "六": "liu4", "七": "qi1", "八": "ba1", "九": "jiu3", "十": "shi2", "百": "bai3", "点": "dian3",
    "半": "ban4", "分": "fen1", "钟": "zhong1", "秒": "miao3", "度": "du4", "之": "zhi1",
    "明": "ming2", "天": "tian1", "早": "zao3", "上": "shang4", "下": "xia4", "午": "wu3",
    "晚": "wan3",
    # names
    "张": "zhang1", "伟": "wei3", "王": "wang2", "芳": "fang1", "李": "li3", "娜": "na4",
    "刘": "liu2", "洋": "yang2", "陈": "chen2", "静": "jing4", "杨": "yang2",
    "赵": "zhao4", "磊": "lei3", "黄": "huang2", "丽": "li4", "周": "zhou1", "杰": "jie2",
    "吴": "wu2", "敏": "min3", "孙": "sun1", "强": "qiang2", "林": "lin2", "晓": "xiao3",
    "妈": "ma1", "爸": "ba4",
    # rooms and devices
    "客": "ke4", "厅": "ting1", "卧": "wo4", "室": "shi4", "厨": "chu2", "房": "fang2", "书": "shu1",
    "卫": "wei4", "生": "sheng1", "间": "jian1", "阳": "yang2", "台": "tai2", "餐": "can1",
    "儿": "er2", "童": "tong2", "车": "che1", "库": "ku4", "灯": "deng1", "空": "kong1",
    "调": "tiao2", "电": "dian4", "视": "shi4", "风": "feng1", "扇": "shan4", "窗": "chuang1",
    "帘": "lian2", "热": "re4", "水": "shui3", "器": "qi4", "音": "yin1", "箱": "xiang1",
    "加": "jia1", "湿": "shi1", "洗": "xi3", "衣": "yi1", "机": "ji1", "量": "liang4",
    # verbs and function words
    "打": "da3", "开": "kai1", "关": "guan1", "闭": "bi4", "掉": "diao4", "把": "ba3", "的": "de5",
    "到": "dao4", "给": "gei3", "话": "hua4", "呼": "hu1", "叫": "jiao4", "发": "fa1", "消": "xiao1",
    "息": "xi1", "微": "wei1", "信": "xin4", "说": "shuo1", "拨": "bo1", "设": "she4", "置": "zhi4",
    "闹": "nao4", "我": "wo3", "起": "qi3", "床": "chuang2", "定": "ding4", "个": "ge4", "计": "ji4",
    "时": "shi2", "倒": "dao3", "小": "xiao3", "提": "ti2", "醒": "xing3", "饭": "fan4",
    "好": "hao3", "了": "le5", "马": "ma3", "日": "ri4", "快": "kuai4", "乐": "le4", "回": "hui2",
}

# Words whose reading differs from their characters' defaults.
WORD_PINYIN = {
    # 一 as a count takes tone 2 before a tone-4 syllable and tone 4 before others; as a digit
    # (拨打五一二, 十一) it keeps tone 1. Only the counted uses the grammar produces are listed.
    "一个": "yi2 ge4", "一分钟": "yi4 fen1 zhong1",
    "早上": "zao3 shang5", "晚上": "wan3 shang5", "消息": "xiao1 xi5",
    "妈妈": "ma1 ma5", "爸爸": "ba4 ba5", "倒计时": "dao4 ji4 shi2",
}
_MAX_WORD = max(len(w) for w in WORD_PINYIN)


def to_pinyin(text: str) -> str:
    """Tone-numbered pinyin, one syllable per character, by longest match on WORD_PINYIN."""
    syllables, i = [], 0
    while i < len(text):
        for size in range(min(_MAX_WORD, len(text) - i), 1, -1):
            word = text[i:i + size]
            if word in WORD_PINYIN:
                syllables.append(WORD_PINYIN[word])
                i += size
                break
        else:
            char = text[i]
            if char not in CHAR_PINYIN:
                raise KeyError(f"no pinyin for {char!r} in {text!r}: add it to CHAR_PINYIN")
            syllables.append(CHAR_PINYIN[char])
            i += 1
    return " ".join(syllables)


def zh_number(n: int, counting: bool = False) -> str:
    """1..99 in Chinese numerals; `counting` uses 两 for 2 before a measure word (两分钟, 两点)."""
    if not 0 <= n <= 99:
        raise ValueError(f"zh_number supports 0..99, got {n}")
    if n == 2 and counting:
        return "两"
    if n < 10:
        return DIGITS[n]
    tens, ones = divmod(n, 10)
    head = "十" if tens == 1 else DIGITS[tens] + "十"
    return head + (DIGITS[ones] if ones else "")


def zh_clock(hour: int, minute: int) -> str:
    """七点, 七点半, 七点零五分, 七点十五分 (12-hour clock, as said to an assistant)."""
    head = zh_number(hour, counting=True) + "点"
    if minute == 0:
        return head
    if minute == 30:
        return head + "半"
    if minute < 10:
        return head + "零" + DIGITS[minute] + "分"
    return head + zh_number(minute) + "分"


def _phone(rng: np.random.Generator) -> str:
    digits = [int(rng.integers(2, 10))] + [int(d) for d in rng.integers(0, 10, size=6)]
    return "".join(DIGITS[d] for d in digits)


def _clock(rng: np.random.Generator) -> str:
    hour = int(rng.integers(1, 13))
    minute = pick(rng, (0, 0, 5, 10, 15, 20, 30, 30, 40, 45, 50, int(rng.integers(1, 60))))
    return zh_clock(hour, minute)


def _sentence(text: str, *keywords: str) -> Sentence:
    return Sentence(text, "zh", keywords, to_pinyin(text))


def _device_power(rng: np.random.Generator) -> Sentence:
    room, device = pick(rng, ROOMS), pick(rng, DEVICES)
    template = pick(rng, ("打开{r}的{d}", "关闭{r}的{d}", "把{r}的{d}打开", "把{r}的{d}关掉"))
    return _sentence(template.format(r=room, d=device), room, device)


def _air_conditioner(rng: np.random.Generator) -> Sentence:
    room, degrees = pick(rng, ROOMS), zh_number(int(rng.integers(16, 29)))
    return _sentence(f"把{room}的空调调到{degrees}度", room, "空调", degrees)


def _lights_level(rng: np.random.Generator) -> Sentence:
    room, pct = pick(rng, ROOMS), zh_number(10 * int(rng.integers(1, 10)))
    return _sentence(f"把{room}的灯调到百分之{pct}", room, "灯", pct)


def _call(rng: np.random.Generator) -> Sentence:
    name = pick(rng, NAMES)
    template = pick(rng, ("给{n}打电话", "打电话给{n}", "呼叫{n}"))
    return _sentence(template.format(n=name), name)


def _dial(rng: np.random.Generator) -> Sentence:
    phone = _phone(rng)
    return _sentence(f"拨打{phone}", phone)


def _message(rng: np.random.Generator) -> Sentence:
    name = pick(rng, NAMES)
    if rng.random() < 0.6:
        return _sentence(f"给{name}发消息说{pick(rng, MESSAGES)}", name)
    return _sentence(f"给{name}发微信", name)


def _alarm(rng: np.random.Generator) -> Sentence:
    when, clock = pick(rng, WHEN), _clock(rng)
    template = pick(rng, ("设置{w}{c}的闹钟", "{w}{c}叫我起床", "定一个{w}{c}的闹钟"))
    return _sentence(template.format(w=when, c=clock), clock)


def _timer(rng: np.random.Generator) -> Sentence:
    unit = pick(rng, ("分钟", "分钟", "秒"))
    amounts = (1, 2, 3, 5, 10, 15, 20, 30, 45) if unit == "分钟" else (10, 15, 20, 30, 45)
    n = zh_number(pick(rng, amounts), counting=True)
    template = pick(rng, ("设置{n}{u}的计时器", "设置一个{n}{u}的计时器", "倒计时{n}{u}"))
    return _sentence(template.format(n=n, u=unit), n + unit)


def _reminder(rng: np.random.Generator) -> Sentence:
    name, clock = pick(rng, NAMES), _clock(rng)
    return _sentence(f"提醒我{pick(rng, WHEN)}{clock}给{name}打电话", clock, name)


def _volume(rng: np.random.Generator) -> Sentence:
    level = zh_number(int(rng.integers(1, 11)))
    return _sentence(f"把音量调到{level}", level)


# Same mix as the English grammar, so per-language results are comparable.
TEMPLATES = ((_device_power, 5), (_air_conditioner, 2), (_lights_level, 2), (_call, 3),
             (_message, 2), (_dial, 2), (_alarm, 3), (_timer, 2), (_reminder, 1), (_volume, 1))


def sample_mandarin(rng: np.random.Generator) -> Sentence:
    """Draw one Mandarin command; the same generator state always gives the same sentence."""
    weights = np.array([w for _, w in TEMPLATES], dtype=float)
    template = TEMPLATES[int(rng.choice(len(TEMPLATES), p=weights / weights.sum()))][0]
    return template(rng)
