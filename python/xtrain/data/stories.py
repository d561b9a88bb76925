"""The built-in corpus: a deterministic generator of children's stories.

Each story is one or two episodes, each one of fourteen plots (a lost toy, a kite stuck in a tree,
sharing, a fear, building something that falls, a broken vase, a new friend, a rainy picnic, a hurt
bird, a race, a gift, a new food, a day trip, counting things) told as setting -> problem ->
attempt -> resolution -> moral. Every step picks among sentence templates filled from the word
tables in story_words.py, so every sentence is one a person wrote: grammatical by construction
(a/an, pronouns, plural and number agreement are handled where the slots are filled).

Long-range structure, so that a model with more capacity and context has more to learn: a story
opens with details it recalls at its end (the hero's favourite wearable and its colour, a hobby),
a day trip unpacks in order the list it packed, counting stories keep a running total, and a
two-episode story ends by recalling the first episode's people and things.

Output is the TinyStories text format: stories separated by a line `<|endoftext|>`.

Determinism: a story is a pure function of its key. Story i of seed s (the flat corpus) has key
"s:i"; the stream (stream.py) and its held-out set use their own keys. The random choices come from
`random.Random("xtrain-stories:" + key)` (string seeds are hashed with SHA-512, stable across Python
versions and platforms), so any prefix of a corpus is the same whatever its length. Bump
STORY_VERSION whenever the text a key gives changes: it names the cache files.

A Tale also adds up the log-probability of its own random choices (`Tale.nats`): the entropy of
the generator, an upper bound on the best loss any model can reach on its text (two choice
sequences that print the same text only lower the true value).
"""

from __future__ import annotations

import math
import os
import random
import re
from pathlib import Path
from typing import Iterator

from . import story_words as W

STORY_VERSION = 2
EOT_LINE = "\n<|endoftext|>\n"
DEFAULT_SEED = 0
# Share of stories told as two episodes with one hero (their ends recall the first episode).
TWO_EPISODES = 0.35
# Share of single-episode stories that still end by telling a parent what happened.
RECAP_ONE = 0.3


def generate_stories(n_stories: int, seed: int = DEFAULT_SEED) -> list[str]:
    """The first `n_stories` stories of the corpus for `seed`."""
    return [make_story(seed, i) for i in range(n_stories)]


def iter_stories(seed: int = DEFAULT_SEED) -> Iterator[str]:
    i = 0
    while True:
        yield make_story(seed, i)
        i += 1


def make_story(seed: int, index: int) -> str:
    """Story `index` of the flat corpus for `seed`."""
    return tell(f"{seed}:{index}").text()


def tell(key: str) -> "Tale":
    """The story whose every random choice comes from the generator keyed by `key`."""
    tale = Tale(random.Random(f"xtrain-stories:{key}"))
    first = tale.pick(PLOTS)
    first(tale)
    tale.recaps.append(tale.fill(RECAPS[first]))
    if tale.chance(TWO_EPISODES):
        second = tale.pick([p for p in PLOTS if p is not first])
        second(tale)
        tale.recaps.append(tale.fill(RECAPS[second]))
        tale.paragraph()
        tale.slots.update(recap1=tale.recaps[0], recap2=tale.recaps[1])
        tale.say("That night, {H} told {his} {mom} all about {recap1}, and about {recap2}.",
                 "Before bed, {H} thought about {recap1}. Then {he} thought about {recap2}.")
    elif tale.chance(RECAP_ONE):
        tale.slots["recap1"] = tale.recaps[0]
        tale.say("That night, {H} told {his} {mom} all about {recap1}.")
    closing(tale)
    return tale


def write_corpus(path: str | os.PathLike, n_bytes: int, seed: int = DEFAULT_SEED) -> Path:
    """Write stories in TinyStories format until the file holds at least `n_bytes` bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for i, story in enumerate(iter_stories(seed)):
            if written >= n_bytes:
                break
            piece = (EOT_LINE if i else "") + story  # markers go between stories
            f.write(piece)
            written += len(piece.encode("utf-8"))
        f.write("\n")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# Story machinery: a Tale holds the random generator, the slot values and the paragraphs so far.


def article(word: str) -> str:
    """'a' or 'an' for the next word (the tables avoid words whose sound breaks the rule)."""
    return "an" if word[0].lower() in "aeiou" else "a"


def with_article(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


# `[a|b|c]` in a template: one of the options, picked like any other choice. Parsed once per
# template (the templates are constants, so the cache stays small).
_ALTERNATIVE = re.compile(r"(\[[^\]]*\])")
_ALTERNATIVES: dict[str, list] = {}


class Tale:
    """One story being told: its generator, slot values, paragraphs so far, and `nats`, the
    negative log-probability of the choices made (every random draw goes through pick, chance
    or sample, which add it up)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.slots: dict[str, str] = {}
        self.paragraphs: list[list[str]] = [[]]
        self.recaps: list[str] = []
        self.names: set[str] = set()  # every character's name, so no two share one
        self.nats = 0.0

    def pick(self, options):
        self.nats += math.log(len(options))
        return self.rng.choice(options)

    def chance(self, p: float) -> bool:
        hit = self.rng.random() < p
        self.nats -= math.log(p if hit else 1.0 - p)
        return hit

    def sample(self, options, k: int) -> list:
        """k distinct options in random order."""
        self.nats += math.log(math.perm(len(options), k))
        return self.rng.sample(options, k)

    def fill(self, template: str) -> str:
        """The template with each `[a|b|c]` resolved to one of its options, then the slots."""
        pieces = _ALTERNATIVES.get(template)
        if pieces is None:
            pieces = _ALTERNATIVES[template] = [
                tuple(p[1:-1].split("|")) if p.startswith("[") else p
                for p in _ALTERNATIVE.split(template) if p]
        text = "".join(p if isinstance(p, str) else self.pick(p) for p in pieces)
        return text.format_map(self.slots)

    def say(self, *options: str) -> None:
        """Append one of the templates, filled from the slots."""
        self.paragraphs[-1].append(self.fill(self.pick(options)))

    def maybe_do(self, p: float, part) -> None:
        """Tell `part(self)` with probability p."""
        if self.chance(p):
            part(self)

    def maybe(self, p: float, *options: str) -> None:
        if self.chance(p):
            self.say(*options)

    def paragraph(self) -> None:
        if self.paragraphs[-1]:
            self.paragraphs.append([])

    def text(self) -> str:
        return "\n\n".join(" ".join(p) for p in self.paragraphs if p)

    def cast(self, role: str, human: bool, need: str | None = None) -> None:
        """Create a character and fill its slots; `role` is "" (hero), "f" (friend)."""
        if human:
            kind = self.pick(W.HUMANS)
            names = W.GIRL_NAMES if kind.noun == "girl" else W.BOY_NAMES
            female = kind.noun == "girl"
        else:
            kinds = [k for k in W.ANIMALS if need is None or need in k.abilities]
            kind = self.pick(kinds)
            names = W.PET_NAMES
            female = self.chance(0.5)
        name = self.pick([n for n in names if n not in self.names])
        self.names.add(name)
        adj = self.pick(kind.adjs)
        word = self.pick(("named", "named", "called"))
        he, him, his = ("she", "her", "her") if female else ("he", "him", "his")
        s = self.slots
        s[role.upper() if role else "H"] = name
        s[role + "he"], s[role + "He"] = he, he.capitalize()
        s[role + "him"], s[role + "his"], s[role + "His"] = him, his, his.capitalize()
        s[role + "himself"] = him + "self"
        s[role + "kind"] = kind.noun
        s[role + "desc"] = f"{with_article(adj + ' ' + kind.noun)}"
        s[role + "intro"] = f"{s[role + 'desc']} {word} {name}"
        s[role + "abilities"] = " ".join(sorted(kind.abilities))
        s[role + "human"] = "yes" if human else ""

    def cast_parent(self) -> None:
        mom = self.pick(("mom", "dad", "mom", "mommy", "daddy"))
        female = mom.startswith("mom")
        s = self.slots
        s["mom"], s["Mom"] = mom, mom.capitalize()
        s["phe"], s["pHe"] = ("she", "She") if female else ("he", "He")
        s["phim"], s["phis"] = ("her", "her") if female else ("him", "his")

    def cast_friend(self, need: str | None = None, human_share: float = 0.7) -> None:
        human = bool(self.slots["human"]) and self.chance(human_share) and need in (None, "reach")
        self.cast("f", human, need=need)
        s = self.slots
        s["friend"] = f"{s['his']} friend {s['F']}" + ("" if human else f" the {s['fkind']}")

    def set_thing(self, tag: str) -> None:
        thing = self.pick([t for t in W.THINGS if tag in t.tags])
        adj = self.pick(thing.adjs)
        self.slots.update(thing=thing.noun, adj_thing=f"{adj} {thing.noun}",
                          a_thing=with_article(f"{adj} {thing.noun}"))

    def set_place(self, tag: str | None = None) -> None:
        place = self.pick([p for p in W.PLACES if tag is None or tag in p.tags])
        spots = self.sample(place.spots, 3)
        self.slots.update(place=place.name, Place=place.name.capitalize(), at_place=place.at,
                          spot1=spots[0], spot2=spots[1], spot3=spots[2],
                          act=self.pick(place.activities), sight=self.pick(place.sights))

    def set_food(self) -> None:
        food = self.pick(W.FOODS)
        adj = self.pick(food.adjs)
        self.slots.update(food=food.noun, adj_food=f"{adj} {food.noun}",
                          container=food.container,
                          a_food=f"{with_article(food.container)} of {adj} {food.noun}")


def intro(t: Tale, human: bool | None = None) -> None:
    """Cast the hero and a parent and open the story; in a second episode, move on in time."""
    s = t.slots
    weather, time = t.pick(W.WEATHERS), t.pick(W.TIMES)
    s["when"], s["When"] = f"one {weather} {time}", f"One {weather} {time}"
    if "H" in s:
        t.paragraph()
        t.say("The next day, {H} woke up early.", "A few days later, {H} had another adventure.",
              "Some time later, something new happened to {H}.",
              "The next week was a busy one for {H}.")
        return
    human = t.chance(0.6) if human is None else human
    t.cast("", human)
    t.cast_parent()
    s["home"] = t.pick(W.HUMAN_HOMES if human else W.ANIMAL_HOMES)
    s["hobby"] = t.pick(W.HOBBIES + (W.HUMAN_HOBBIES if human else ()))
    t.say("Once upon a time, there was {intro}.",
          "Once upon a time, in {home}, there lived {intro}.",
          "There once was {intro}.",
          "Once upon a time, there was {intro}. {He} lived in {home}.",
          "{H} was {desc} who lived in {home}.",
          "Long ago, in {home}, there was {intro}.")
    t.say("{He} loved to {hobby}.", "{He} liked to {hobby} more than anything.",
          "Every day, {he} liked to {hobby}.", "{H} loved to {hobby} with {his} {mom}.",
          "More than anything, {H} loved to {hobby}.")
    if t.chance(0.5):
        looks = W.HUMAN_LOOKS if human else W.ANIMAL_LOOKS
        s["looks"] = f"{t.pick(looks[0])} {t.pick(looks[1])} and {t.pick(looks[2])} eyes"
        t.say("{He} had {looks}.", "{H} had {looks}.")
    if t.chance(0.6):  # the detail the story's last sentence recalls
        wearables = W.HUMAN_WEARABLES if human else W.ANIMAL_WEARABLES
        s["sig"] = f"{t.pick(W.COLORS)} {t.pick(wearables)}"
        t.say("{He} always wore {his} {sig}.", "{He} never went anywhere without {his} {sig}.",
              "{His} favorite thing to wear was {his} {sig}.")
    t.maybe(0.3, "{He} had a [big|wide] smile and a kind heart.", "{He} was always happy.",
            "{He} was very curious about everything.", "Everyone who knew {him} liked {him}.")


def scenery(t: Tale) -> None:
    """One sentence of what else was going on around the hero: a few critters doing something."""
    one, many, adjs, acts = t.pick(W.CRITTERS)
    n = t.pick((0, 1, 1, 2, 3, 4, 5))
    adj = t.pick(adjs)
    if n == 1:
        scene = f"{article(adj) if t.chance(0.5) else 'one'} {adj} {one}"
    else:
        scene = f"{W.NUMBER_WORDS[n] if n else t.pick(('some', 'many', 'lots of'))} {adj} {many}"
    t.slots.update(scene=scene, Scene=scene[0].upper() + scene[1:], scene_act=t.pick(acts))
    t.say("{Scene} {scene_act}.", "Not far away, {scene} {scene_act}.",
          "[Just then|At that moment|Nearby], {scene} {scene_act}.")


def sights(t: Tale, p: float) -> None:
    """Maybe what the place looked like, maybe what else was going on there."""
    t.maybe(p, "{sight}")
    t.maybe_do(p, scenery)


def closing(t: Tale) -> None:
    """The last sentence: recall the opening's detail (what the hero wears, what it loves)."""
    if "sig" in t.slots and t.chance(0.8):
        t.say("Then {H} ran off with {his} {sig} to {hobby} again.",
              "That night, {H} went to sleep with {his} {sig} close by.",
              "The next day, {H} put on {his} {sig} and went out to {hobby}.")
    elif t.chance(0.3):
        t.say("And the next day, {H} went out to {hobby} again.", "The end.")


MORALS = {
    "help": ("friends help each other", "it is good to ask for help when you need it",
             "two friends can do more than one", "a good friend is always there to help"),
    "careful": ("it is important to take care of the things you love",
                "it is good to keep your things close"),
    "share": ("sharing makes everyone happy", "it feels good to share",
              "a treat tastes better when you share it with a friend"),
    "brave": ("being brave means trying even when you are scared",
              "things are not so scary once you try them",
              "you are braver than you think"),
    "patience": ("if you keep trying, you can do hard things",
                 "it is okay to fail, as long as you try again",
                 "good things take time and patience"),
    "honest": ("it is always best to tell the truth",
               "telling the truth is the right thing to do, even when it is hard"),
    "kind": ("a little kindness can make a new friend", "being kind is always a good idea",
             "everyone needs a friend sometimes"),
    "bright": ("you can have fun even when things do not go as planned",
               "a rainy day can be a happy day too", "being together is what makes a day fun"),
    "care": ("being kind to animals is important", "a little care can help someone get better"),
    "win": ("helping a friend is more important than winning",
            "a true friend cares more about you than about a race"),
    "gift": ("a gift made with love is the best gift of all",
             "the best gifts come from the heart"),
    "new": ("you should try new things before you say you do not like them",
            "new things can be good things"),
    "ready": ("it is good to be ready", "a little planning makes a day more fun",
              "a good plan makes a good day"),
    "count": ("sharing and helping make everything better", "friends make the numbers add up",
              "it is fun to count things with a friend"),
}


def moral(t: Tale, theme: str) -> None:
    t.slots["moral"] = t.pick(MORALS[theme])
    t.say("{H} learned that {moral}.", "From that day on, {H} knew that {moral}.",
          "That day, {H} learned an important lesson: {moral}.",
          "{H} would always remember that {moral}.",
          "And so {H} learned that {moral}.")


# ---------------------------------------------------------------------------------------------
# Plots. Each tells one story into the Tale it is given.


def lost_toy(t: Tale) -> None:
    intro(t)
    t.set_thing("lose")
    t.set_place()
    t.cast_friend()
    t.say("{He} had {a_thing} that {he} loved [very much|so much|more than anything].",
          "{His} favorite toy was {a_thing}.",
          "{H} had {a_thing}. It was {his} favorite thing in the whole world.")
    t.maybe(0.5, "{He} took the {thing} everywhere {he} went.",
            "{He} played with the {thing} every day.")
    t.paragraph()
    t.say("[One day|One time|Once], {H} went to {place} with {his} {thing}.",
          "{When}, {H} took {his} {thing} to {place}.",
          "[One day|One time|Once], {H} and {his} {mom} went to {place}. {H} brought {his} "
          "{thing}.")
    sights(t, 0.6)
    t.say("{H} put the {thing} down to {act}.",
          "{He} wanted to {act}, so {he} left the {thing} on the grass.",
          "{He} put the {thing} on the ground and ran off to {act}.")
    t.say("When {he} came back, the {thing} was gone!",
          "After a while, {he} looked for {his} {thing}, but it was not there!",
          "But when {he} turned around, the {thing} was gone!")
    t.say('"Oh no! Where is my {thing}?" {H} cried.',
          '"My {thing}! I lost my {thing}!" said {H}.',
          '"Where did my {thing} go?" {H} asked in a small voice.')
    t.paragraph()
    t.say("{H} looked {spot1}, but the {thing} was not there. {He} looked {spot2}, "
          "but it was not there either.",
          "{He} looked {spot1}. No {thing}. {He} looked {spot2}. Still no {thing}.")
    t.say("{He} felt [very|so|really] sad and started to cry.",
          "{H} sat down and felt [very|so|really] sad.",
          "Tears came to {his} eyes.")
    t.say("[Just then|At that moment], {fintro} came by.", "Then {fintro} walked over.",
          "[Just then|At that moment], {his} friend {F} came to play.")
    t.say('"Why are you sad, {H}?" asked {F}.', '"What is wrong?" {F} asked.',
          '"{H}, why are you crying?" asked {F}.')
    t.say('"I lost my {thing}," said {H}.', '"I cannot find my {thing}," {H} said.',
          '"My {adj_thing} is gone," {H} said sadly.')
    t.say('"Don\'t worry. I will help you find it!" said {F}.',
          '"Let\'s look together," said {F} with a smile.',
          '"I am good at finding things," said {F}. "I will help you."')
    if "sniff" in t.slots["fabilities"]:
        t.say("{F} sniffed the ground with {fhis} nose. Sniff, sniff! {fHe} followed the smell "
              "until {fhe} found the {thing} {spot3}.")
    else:
        t.say("They looked everywhere together.", "{H} and {F} looked high and low.")
        t.say('At last, {F} shouted, "Look! There it is!" The {thing} was {spot3}!',
              "Then {H} saw something {spot3}. It was the {adj_thing}!")
    t.paragraph()
    t.say("{H} was so [happy|glad]. {He} hugged the {thing}, and then {he} hugged {F}.",
          "{H} jumped up and down with joy.",
          "{H} picked up the {thing} and smiled a [big|wide] smile.")
    t.say('"Thank you, {F}! You are a good friend," said {H}.',
          '"Thank you for helping me," {H} said to {F}.')
    moral(t, t.pick(("help", "careful")))


def stuck_in_tree(t: Tale) -> None:
    intro(t)
    t.set_thing(t.pick(("wind", "throw")))
    t.set_place("tree")
    helper = t.pick(("fly", "climb", "reach", None))
    t.cast_friend(need=helper)
    t.paragraph()
    t.slots["weather"] = t.pick(("sunny", "windy", "bright", "warm"))
    t.say("One {weather} day, {H} went to {place} with {friend}.",
          "[One day|One time|Once], {H} and {friend} went to {place} to play.")
    t.say("{H} brought {his} {adj_thing}.", "{H} had {a_thing} with {him}.")
    sights(t, 0.5)
    thing = t.slots["thing"]
    if any(thing == x.noun for x in W.THINGS if "wind" in x.tags):
        t.say("[Suddenly|All of a sudden], a big wind came. It pulled the {thing} up, up, up and "
              "into a tall tree!",
              "The wind blew hard, and the {thing} flew away. It got stuck in the top of a "
              "tall tree!")
    else:
        t.say("{H} threw the {thing} very high. It went up, up, up and landed in a tall tree!",
              "{H} threw the {thing} too hard, and it got stuck in the branches of a tall tree.")
    t.say('"Oh no!" said {H}. "My {thing} is stuck!"',
          '"My {thing}!" cried {H}. "How will I get it down?"')
    t.paragraph()
    t.say("{H} jumped as high as {he} could, but {he} could not reach it.",
          "{H} tried to reach the {thing}, but the branch was too high.")
    t.maybe(0.6, "{He} tried to shake the tree, but the {thing} did not move.",
            "{He} stood on {his} toes and stretched, but it was no use.")
    t.say('"I can help," said {F}.', '"Don\'t worry, {H}," said {F}. "I have an idea."')
    kind = t.slots["fkind"]
    if helper == "fly":
        t.say("{F} flapped {fhis} wings and flew up to the branch. {fHe} pushed the {thing} "
              "with {fhis} head until it fell down.")
    elif helper == "climb":
        t.say("{F} climbed up the tree, quick as a flash. {fHe} reached the branch and pushed "
              "the {thing} down.",
              "Up, up, up went {F}, all the way to the top of the tree. {fHe} set the {thing} "
              "free, and it fell down.")
    elif helper == "reach" and kind == "giraffe":
        t.say("{F} stretched {fhis} long neck and took the {thing} from the branch with {fhis} "
              "mouth.")
    elif helper == "reach" and kind == "elephant":
        t.say("{F} reached up with {fhis} long trunk and pulled the {thing} down.")
    elif helper == "reach" and kind == "bear":
        t.say("{F} stood up tall on {fhis} back legs and took the {thing} down with {fhis} "
              "big paw.")
    elif helper == "reach":
        t.say("{F} found a long stick. {fHe} poked the {thing} gently until it fell down.",
              '{F} said, "Let\'s get a long stick!" They found one and poked the {thing} until '
              "it came down.")
    else:
        t.say("{F} ran to get {H}'s {mom}. {H}'s {mom} came with a ladder, climbed up and "
              "got the {thing} down.")
    t.paragraph()
    t.say('{H} was so happy to have {his} {thing} back. "Thank you, {F}!" {he} said.',
          '{H} hugged {F}. "You are the best friend ever!" {he} said.')
    t.maybe(0.5, "They played together until the sun went down.",
            "After that, they played far away from the tall tree.")
    moral(t, "help")


def sharing(t: Tale) -> None:
    intro(t)
    t.set_food()
    t.set_place()
    t.cast_friend()
    t.paragraph()
    t.say("[One day|One time|Once], {H}'s {mom} gave {him} {a_food}.",
          "{When}, {H}'s {mom} gave {him} {a_food}.",
          "One morning, {H} found {a_food} on the kitchen table. {His} {mom} said {he} "
          "could have them.")
    t.say("{H} went to {place} to eat the {food}.", "{He} took the {food} to {place}.")
    sights(t, 0.5)
    t.say("There {he} saw {fintro}.", "Soon {he} met {fintro}.")
    t.say("{F} had no {food}. {fHe} looked hungry.",
          "{F} looked at the {food}. {fHe} did not have any food.")
    t.say('"Can I have some {food}, please?" asked {F}.',
          '"Those {food} look so good," said {F}. "May I have one?"')
    if t.chance(0.6):
        t.say('"No," said {H}. "They are all mine!"',
              '{H} held the {container} tight. "These are my {food}," {he} said.')
        t.say("{F} walked away slowly. {fHe} looked very sad.",
              "{F} looked down at the ground and said nothing.")
        t.paragraph()
        t.say("{H} ate one of the {food}, but it did not taste as good as before.",
              "{H} sat alone with {his} {food}. Somehow {he} did not feel happy.")
        t.say("{He} thought about {F}. {He} felt bad inside.",
              "{He} knew {he} had not been kind.")
        t.say('{H} ran after {F}. "Wait!" {he} called. "Do you want to share my {food}?"',
              '{H} went to {F} and said, "I am sorry. Let\'s share the {food}."')
        t.say('{F} smiled. "Yes, please!" {fhe} said.',
              "{F}'s face lit up with a [big|wide] smile.")
    else:
        t.say("{H} thought for a moment. Then {he} gave {F} half of the {food}.",
              '"Of course!" said {H}. "We can share them."')
        t.say('"Thank you!" said {F}. "You are very kind."',
              "{F} was [very|so|really] happy. {fHe} thanked {H} again and again.")
        t.paragraph()
        t.say("The next day, {F} came back with a surprise. {fHe} had a big, sweet pie, and "
              "{fhe} shared it with {H}.",
              "The next day, {F} brought some treats too, and {fhe} shared them with {H}.")
    t.say("They sat together and ate. They talked and laughed all afternoon.",
          "The two friends ate together and had a lot of fun.")
    moral(t, "share")


def fear(t: Tale) -> None:
    intro(t)
    fears = W.FEARS if t.slots["human"] else W.FEARS[:-1]
    feared, act, truth = t.pick(fears)
    t.slots.update(feared=feared, act_brave=act, truth=truth)
    helper_is_parent = t.chance(0.5)
    if not helper_is_parent:
        t.cast_friend()
    # First mention "her friend Pip the owl", later ones "Pip"; a parent is "her mom" throughout.
    parent = f"{t.slots['his']} {t.slots['mom']}"
    t.slots["helper_ref"] = parent if helper_is_parent else t.slots["friend"]
    t.slots["helper"] = parent if helper_is_parent else t.slots["F"]
    t.slots["Helper"] = t.slots["helper"][0].upper() + t.slots["helper"][1:]
    t.say("But {H} had a secret. {He} was afraid of {feared}.",
          "There was just one thing {H} did not like. {He} was scared of {feared}.",
          "{H} was afraid of {feared}.")
    t.say("Just thinking about it made {him} shake.",
          "{He} did not tell anyone, because {he} felt silly.",
          "Whenever {he} thought about {feared}, {his} tummy felt funny.")
    t.paragraph()
    t.say("[One day|One time|Once], {helper_ref} saw that {H} looked worried.",
          "[One day|One time|Once], {H} told {helper_ref} about {his} fear.")
    t.say('"I am scared of {feared}," said {H} in a small voice.',
          '"I don\'t like {feared}," {H} whispered. "It scares me."')
    t.say('"It is okay to be scared," said {helper}. "But you are braver than you think."',
          '"Everyone is scared sometimes," said {helper}. "Let\'s try together, one little '
          'step at a time."')
    t.paragraph()
    t.say("{H} took a deep breath. Then {he} {act_brave}.",
          "{H} held on tight and counted to three. Then {he} {act_brave}.")
    t.say("{truth}")
    t.say('{H} smiled. "I am not scared anymore!" {he} said.',
          '"I did it!" shouted {H}. "I was brave!"')
    t.maybe(0.6, "{Helper} gave {him} a big hug.", '"I am so proud of you," said {helper}.')
    moral(t, "brave")


def build_again(t: Tale) -> None:
    intro(t)
    what, where, falls = t.pick(W.BUILDS)
    t.slots.update(build=what, the_build="the " + what.split(" ", 1)[1], falls=falls)
    t.cast_friend()
    t.paragraph()
    if where == "sand":
        t.say("[One day|One time|Once], {H} went to the beach with {friend}.")
    elif where == "home":
        t.say("One rainy day, {H} and {friend} were playing at home.")
    elif where == "snow":
        t.say("One winter morning, the whole yard was white with snow. {H} went outside with "
              "{friend}.")
    elif where == "water":
        t.say("[One day|One time|Once], {H} and {friend} went to play by a little stream.")
    else:
        t.set_place("tree")
        t.say("[One day|One time|Once], {H} went to {place} with {friend}.")
    t.say("{H} wanted to make {build}.", '"Let\'s make {build}!" said {H}.')
    t.maybe_do(0.5, scenery)
    t.say("{He} worked very hard. It was getting bigger and bigger.",
          "{H} worked for a long time. {He} was [very|so] proud of it.")
    t.say("But then {the_build} {falls}!", "[Suddenly|All of a sudden], {the_build} {falls}.")
    t.paragraph()
    t.say('{H} was very sad. "I give up," {he} said.',
          '{H} sat down and frowned. "I will never make it," {he} said.',
          '{H} felt like crying. "It is too hard," {he} said.')
    t.say('"Don\'t give up!" said {F}. "Let\'s try again together."',
          '{F} sat down next to {him}. "We can make it again, and this time we will make it '
          'even better," {fhe} said.')
    t.say("This time, they worked slowly and carefully.",
          "This time, they put the big pieces at the bottom and the small pieces at the top.",
          "This time, {H} and {F} helped each other with every part.")
    t.say("[At last|Finally], {the_build} was done. It was bigger and stronger than before!",
          "When they were done, {the_build} stood tall and strong.")
    t.say('"We did it!" shouted {H} and {F}.', "{H} clapped {his} hands with joy.")
    moral(t, "patience")


def broken_vase(t: Tale) -> None:
    intro(t)
    t.set_thing("break")
    t.slots["hide"] = t.pick(W.HOME_SPOTS)
    t.say("{H}'s {mom} had {a_thing}. {pHe} loved it [very much|so much|more than anything].",
          "In {H}'s house, there was {a_thing}. It was very special to {his} {mom}.")
    t.paragraph()
    t.say('One day, {H} was playing with a ball in the house. {His} {mom} always said, "No '
          'ball games in the house!" But {H} forgot.',
          "[One day|One time|Once], {H} was running and jumping in the house.")
    t.say("Crash! {He} bumped into the {thing}, and it fell to the floor. It broke into many "
          "pieces.",
          "Oops! The {thing} fell down and broke into little pieces.")
    t.say("{H} was scared. {He} hid the pieces {hide}.",
          "{H} did not know what to do. Quickly, {he} put the pieces {hide}.")
    t.paragraph()
    t.say('Later, {his} {mom} asked, "Where is my {thing}?"',
          'When {his} {mom} came into the room, {phe} said, "Have you seen my {thing}?"')
    t.say("{H} did not say anything. {He} felt a big knot in {his} tummy.",
          '"I don\'t know," said {H}. But {he} did not feel good inside.')
    t.say("That night, {H} could not sleep. {He} knew {he} had to tell the truth.",
          "{H} felt worse and worse. [At last|Finally], {he} knew what {he} had to do.")
    t.paragraph()
    t.say('{H} went to {his} {mom}. "{Mom}, I broke your {thing}," {he} said. "I am sorry."',
          '"{Mom}," said {H} softly, "I have to tell you something. I broke the {thing}. I am '
          'very sorry."')
    t.say('{His} {mom} gave {him} a big hug. "Thank you for telling me the truth," {phe} said.',
          '{His} {mom} smiled. "I am glad you told me," {phe} said. "A {thing} can be fixed."')
    t.maybe(0.6, "Together, they glued the pieces back together.",
            "Then they cleaned up the pieces together.")
    t.say("{H} felt light and happy again.", "The knot in {H}'s tummy went away.")
    moral(t, "honest")


def new_friend(t: Tale) -> None:
    intro(t)
    t.set_place()
    t.cast_friend(human_share=0.8)
    t.paragraph()
    t.say("[One day|One time|Once], {H} was playing {at_place}.", "{When}, {H} went to {place}.")
    sights(t, 0.5)
    t.say("{He} saw {fintro} sitting all alone.",
          "Under a tree, {he} saw {fintro} sitting by {fhimself}.")
    t.say("{F} was new, and {fhe} did not know anyone.",
          "{fHe} looked sad and a little shy.")
    t.paragraph()
    t.say('{H} walked over and said, "Hi! I am {H}. What is your name?"',
          '{H} went up to {fhim}. "Hello! My name is {H}," {he} said.')
    t.say('"I am {F}," said the {fkind} in a small voice.',
          '"My name is {F}," said the {fkind} quietly.')
    t.say('"Do you want to {act} with me?" asked {H}.',
          '"Would you like to play with me?" asked {H}. "We can {act}."')
    t.say('{F} smiled a big smile. "Yes, I would love to!"',
          "{F}'s eyes lit up. {fHe} nodded and jumped up.")
    t.say("They played together [all day long|until the sun went down].",
          "They laughed and played until it was "
          "time to go home.")
    t.paragraph()
    t.say('When it was time to go home, {F} said, "Thank you for being my friend."',
          'Before {F} went home, {fhe} said, "Can we play again tomorrow?" "Yes!" said {H}.')
    t.say("From then on, {H} and {F} were best friends.",
          "After that day, they played together every day.")
    moral(t, "kind")


def rainy_picnic(t: Tale) -> None:
    intro(t)
    t.set_food()
    t.set_place()
    t.cast_friend()
    t.slots["game"] = t.pick(W.HOME_GAMES)
    t.paragraph()
    t.say("[One day|One time|Once], {H} and {friend} wanted to have a picnic {at_place}.",
          "{H} and {friend} planned a big picnic {at_place}.")
    t.say("{H}'s {mom} packed {a_food} for them.",
          "They packed a blanket and {a_food}.")
    t.say("But when they looked outside, the sky was gray. Then big drops of rain began to "
          "fall.",
          "But just as they were ready to go, it started to rain. It rained and rained.")
    t.say('"Oh no," said {H}. "Now we cannot have our picnic."',
          '{H} looked out the window and sighed. "Our picnic is ruined," {he} said.')
    t.paragraph()
    t.say('Then {F} had an idea. "Let\'s have a picnic inside!" {fhe} said.',
          '{H}\'s {mom} smiled. "Why don\'t you have a picnic inside?" {phe} said.')
    t.say("They put the blanket on the floor and ate the {food} there.",
          "They sat on the blanket in the living room and shared the {food}.")
    t.say("After that, they decided to {game}.", "Then they wanted to {game}.")
    t.say("Outside, the rain went pitter-patter. Inside, everyone was warm and happy.",
          "They had so much fun that they forgot all about the rain.")
    t.maybe(0.6, "When the rain stopped, they saw a big rainbow in the sky.",
            "Later, the sun came out, and a rainbow shone over the houses.")
    moral(t, "bright")


def hurt_bird(t: Tale) -> None:
    intro(t)
    t.set_place("tree")
    critter, hurt = t.pick((("bird", "wing"), ("duckling", "leg"), ("baby rabbit", "paw"),
                            ("butterfly", "wing")))
    t.slots.update(critter=critter, hurt=hurt)
    t.paragraph()
    t.say("[One day|One time|Once], {H} was walking {at_place} when {he} heard a soft sound.",
          "{When}, {H} went for a walk {at_place}. [Suddenly|All of a sudden], {he} heard a "
          "little cry.")
    t.say("It was a little {critter} with a hurt {hurt}.",
          "{He} looked down and saw a tiny {critter}. Its {hurt} was hurt.")
    t.maybe_do(0.3, scenery)
    t.say('"Poor little {critter}," said {H}. "I will help you."',
          '"Don\'t be scared," {H} said softly. "I will take care of you."')
    t.paragraph()
    t.say("{H} carefully picked up the {critter} and took it home.",
          "{H} made a soft bed of leaves and put the {critter} in it.")
    t.say("{He} gave it water and food every day, and {he} kept it warm.",
          "Every day, {H} gave the {critter} something to eat and talked to it gently.")
    t.maybe(0.5, "{His} {mom} helped {him} too.", "It was hard work, but {H} never gave up.")
    t.say("After a few days, the {critter}'s {hurt} was better.",
          "Day by day, the {critter} got stronger.")
    t.paragraph()
    if t.slots["critter"] in ("bird", "butterfly"):
        t.say("One morning, it flapped its wings and flew up into the sky.")
    else:
        t.say("One morning, it hopped out of its bed and ran back to its family.")
    t.say("{H} waved goodbye. {He} was a little sad, but mostly happy.",
          '"Goodbye, little {critter}!" said {H}.')
    t.maybe(0.6, "The next day, the {critter} came back to visit {H}, as if to say thank you.")
    moral(t, "care")


def race(t: Tale) -> None:
    intro(t)
    t.set_place()
    t.cast_friend()
    t.paragraph()
    t.say("{H} and {friend} both loved to run.", "{H} liked to run fast, and so did {friend}.")
    t.say("[One day|One time|Once], they had a race {at_place}.",
          "{When}, they had a race {at_place}.",
          'One day, {F} said, "Let\'s have a race {at_place}!"')
    t.say('"Ready, set, go!" shouted {H}\'s {mom}.', '"One, two, three, go!" they shouted.')
    t.maybe_do(0.4, scenery)
    t.say("They ran as fast as they could. {H} was in front.",
          "Off they went! Soon {H} was a little ahead.")
    t.say("But then {F} tripped over a rock and fell down.",
          "[Suddenly|All of a sudden], {F} slipped and fell on the ground.")
    t.paragraph()
    t.say("{H} heard {F} cry. {He} stopped running.",
          "{H} could see the finish line. {He} could win the race!")
    t.say("{H} turned around and ran back to {F}.", "But {H} did not run to the finish line. "
          "{He} turned around and went back to {F}.")
    t.say('"Are you okay?" asked {H}. {He} helped {F} stand up.',
          '"Let me help you," said {H}, and {he} held out {his} hand.')
    t.say("They walked to the finish line together, side by side.",
          "Together, they crossed the finish line at the same time.")
    t.say("Everyone clapped and cheered for them.", '"You are a true friend," said {F}.')
    moral(t, "win")


def gift(t: Tale) -> None:
    intro(t, human=t.chance(0.8))
    t.slots["gift"] = t.pick(W.GIFTS)
    t.paragraph()
    t.say("Tomorrow was {H}'s {mom}'s birthday. {H} wanted to give {phim} something special.",
          "{H}'s {mom} had a birthday coming soon, and {H} wanted to surprise {phim}.")
    t.say("But {H} had no money to buy a present.", "But {he} did not know what to give.")
    t.say("{He} thought and thought. Then {he} had an idea! {He} would make {gift}.",
          "Then {H} had a wonderful idea. {He} would make {gift} all by {himself}.")
    t.paragraph()
    t.say("{He} worked on it all day. It was not perfect, but {he} did {his} best.",
          "It was hard work. Some parts came out a little crooked, but {H} kept going.")
    t.say("When it was done, {he} hid it under {his} bed.",
          "[At last|Finally], it was ready. {H} wrapped it in pretty paper.")
    t.paragraph()
    t.say("The next morning, {H} gave {his} {mom} the gift.",
          '"Happy birthday!" said {H}, and {he} gave {his} {mom} the present.')
    t.say('{His} {mom}\'s eyes filled with happy tears. "This is the best gift ever," {phe} said.',
          '{His} {mom} smiled a big smile. "You made this for me? I love it!" {phe} said.')
    t.say("{pHe} gave {H} a big hug.", "{H} felt warm and happy inside.")
    moral(t, "gift")


def new_food(t: Tale) -> None:
    intro(t, human=t.chance(0.8))
    veg, plural = t.pick(W.VEGETABLES)
    t.slots.update(veg=veg, it="them" if plural else "it", was="were" if plural else "was",
                   they="they" if plural else "it", look="look" if plural else "looks")
    t.paragraph()
    t.say("One evening, {H}'s {mom} made {veg} for dinner.",
          "For dinner, there {was} {veg} on {H}'s plate.")
    t.say('"Yuck!" said {H}. "I don\'t like {veg}!"',
          '{H} made a face. "I don\'t want to eat {veg}," {he} said.')
    t.say('"Have you ever tried {it}?" asked {his} {mom}.',
          '"How do you know you don\'t like {it}?" asked {his} {mom}.')
    t.say("{H} shook {his} head. {He} had never tried {it}.",
          '"No," said {H}. "But {they} {look} funny."')
    t.say('"Just try one little bite," said {his} {mom}.',
          '"Try one bite. If you don\'t like {it}, you don\'t have to eat more," said {his} '
          "{mom}.")
    t.paragraph()
    t.say("{H} closed {his} eyes and took a small bite.",
          "{H} picked up {his} spoon and took a tiny bite.")
    t.say("{He} chewed and chewed. Then {his} eyes opened wide.",
          "At first, {he} did not know what to think. Then {he} smiled.")
    t.say('"The {veg} {was} yummy!" said {H}. "Can I have more?"',
          '"Mmm! I like {veg}!" said {H}, and {he} ate everything on {his} plate.')
    t.say("{His} {mom} laughed and gave {him} some more.",
          "{His} {mom} was [very|so|really] happy.")
    moral(t, "new")


def day_trip(t: Tale) -> None:
    intro(t)
    t.set_place()
    items = t.sample(W.TRIP_ITEMS, t.pick((2, 3, 3, 4)))
    packed = [item for item, _ in items]
    t.slots.update(packed=and_list(packed),
                   packed_back=and_list(["the " + item.split(" ", 1)[1] for item in packed]))
    t.paragraph()
    t.say("{When}, {H} and {his} {mom} went on a trip to {place}.",
          "{H} was going to spend the whole day {at_place}.",
          "[One day|One time|Once], {H}'s {mom} said, \"Today we will go to {place}!\"")
    t.say("{H} packed {his} bag with {packed}.", "Into {his} bag went {packed}.",
          "{H} put {packed} in {his} bag.")
    t.maybe(0.5, "{His} bag was heavy, but {he} did not mind.",
            '"Do you have everything?" asked {his} {mom}. "Yes!" said {H}.')
    t.paragraph()
    t.say("When they got to {place}, {H} opened {his} bag.", "Soon they were {at_place}.")
    sights(t, 0.6)
    for i, (_, use) in enumerate(items):
        first, last = i == 0, i == len(items) - 1
        t.slots["use"] = use
        if first:
            t.say("First, {he} {use}.", "The first thing {H} did was this: {he} {use}.")
        elif last:
            t.say("[At last|Finally], {he} {use}.", "Last of all, {he} {use}.")
        else:
            t.say("Then {he} {use}.", "After that, {he} {use}.", "Next, {he} {use}.")
    t.paragraph()
    t.say("When the sun went down, {H} packed {packed_back} back in {his} bag.",
          "Before they went home, {H} put {packed_back} back in {his} bag.")
    t.say("It had been a perfect day.", '"This was the best trip ever," said {H}.')
    moral(t, "ready")


def counting(t: Tale) -> None:
    intro(t)
    one, many = t.pick(W.COUNTABLES)
    have = t.pick(range(3, 10))
    lost = t.pick(range(1, min(3, have - 1) + 1))
    given = t.pick(range(1, 5))
    left, total = have - lost, have - lost + given
    t.cast_friend()
    lost_word = W.NUMBER_WORDS[lost]
    t.slots.update(one=one, many=many, have=count(have, one, many), lost=lost_word,
                   Lost=lost_word.capitalize(), left=count(left, one, many),
                   given_more=f"{W.NUMBER_WORDS[given]} more {one if given == 1 else many}",
                   total=count(total, one, many), counted=count_out(have),
                   Counted=count_out(have).capitalize(), counted_total=count_out(total))
    t.paragraph()
    t.say("{When}, {H} found {have}.", "[One day|One time|Once], {H}'s {mom} gave {him} {have}.",
          "{H} had {have}. {He} kept them in a little basket.")
    t.maybe(0.7, "{He} counted them: {counted}.", '"{Counted}!" counted {H}.')
    t.say("{He} put them in a basket and went outside.",
          "{He} carried them carefully in a basket.")
    t.maybe_do(0.5, scenery)
    t.paragraph()
    if lost == 1:
        t.say("But on the way, one of the {many} fell out of the basket and rolled away.",
              "Oh no! One {one} fell out and rolled under a bush.")
    else:
        t.say("But on the way, {lost} of the {many} fell out of the basket and rolled away.",
              "Oh no! {Lost} {many} fell out and rolled under a bush.")
    t.say("Now {H} had only {left}.", "{H} looked in the basket. There were only {left} left.")
    t.say("{He} felt a little sad.", '"Oh dear," said {H}.')
    t.say("[Just then|At that moment], {fintro} came by.", "Then {his} friend {F} came to play.")
    t.say("{F} gave {H} {given_more}.", '"Here," said {F}, and {fhe} gave {H} {given_more}.')
    t.say("Now {H} had {total}!", "{H} counted again. Now there were {total}!")
    t.maybe(0.5, "{He} counted them: {counted_total}.")
    moral(t, "count")


def and_list(items: list[str]) -> str:
    """'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def count(n: int, one: str, many: str) -> str:
    """'one apple', 'three apples'."""
    return f"{W.NUMBER_WORDS[n]} {one if n == 1 else many}"


def count_out(n: int) -> str:
    """'one, two and three'."""
    return and_list(list(W.NUMBER_WORDS[1:n + 1]))


PLOTS = (lost_toy, stuck_in_tree, sharing, fear, build_again, broken_vase, new_friend,
         rainy_picnic, hurt_bird, race, gift, new_food, day_trip, counting)
# What the hero tells of an episode afterwards, filled when the episode ends (its slots change
# in the next one).
RECAPS = {
    lost_toy: "the day {he} lost {his} {thing} {at_place}",
    stuck_in_tree: "the {thing} that got stuck in the tall tree",
    sharing: "the {food} {he} shared with {F}",
    fear: "how {he} stopped being afraid of {feared}",
    build_again: "how {he} and {F} made {build} twice",
    broken_vase: "the broken {thing}",
    new_friend: "{his} new friend {F}",
    rainy_picnic: "the picnic on the rainy day",
    hurt_bird: "the little {critter} with the hurt {hurt}",
    race: "the race with {F}",
    gift: "the present for {his} {mom}",
    new_food: "the first time {he} ate {veg}",
    day_trip: "the trip to {place}",
    counting: "the {many} {he} counted",
}
