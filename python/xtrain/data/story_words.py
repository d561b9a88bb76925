"""Word tables for the built-in story generator (stories.py): who, what, where.

Every entry is a plain phrase written to slot into the templates in stories.py: nouns are singular
unless marked, places carry the preposition they take ("at the park", "in the garden"), spots are
prepositional phrases ("under a bench"). Tags say which plots an entry fits, so a kite gets stuck in
a tree but a teddy bear does not.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    noun: str
    adjs: tuple[str, ...]
    abilities: frozenset[str] = frozenset()  # fly, climb, reach, swim, sniff, strong
    human: bool = False


@dataclass(frozen=True)
class Thing:
    noun: str
    adjs: tuple[str, ...]
    tags: frozenset[str]  # lose, wind, throw, break, water


@dataclass(frozen=True)
class Food:
    noun: str  # plural
    container: str
    adjs: tuple[str, ...]


@dataclass(frozen=True)
class Place:
    name: str  # "the park"
    at: str  # "at the park"
    spots: tuple[str, ...]
    activities: tuple[str, ...]
    sights: tuple[str, ...]
    tags: frozenset[str]  # tree, water, sand


GIRL_NAMES = ("Lily", "Mia", "Emma", "Sue", "Anna", "Lucy", "Zoe", "Ella", "Sara", "Amy", "Kate",
              "Rosie", "Maya", "Nora", "Ruby", "Daisy", "Molly", "Tina", "Jenny", "Grace", "Chloe",
              "Ivy", "Hannah", "Lena", "Ava", "Sophie", "Bella", "Julia", "Kim", "Olive", "Jane",
              "Ellie", "Nina", "Clara", "Poppy", "Alice")
BOY_NAMES = ("Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Finn", "Jake", "Noah", "Oliver",
             "Luke", "Adam", "Ryan", "Eli", "Theo", "Danny", "Mark", "Joe", "Owen", "Henry",
             "Billy", "Peter", "Alex", "Jimmy", "Kevin", "Lucas", "Paul", "Ned", "Bob", "Charlie",
             "Dan", "Ethan", "Hugo", "Ian", "Oscar")
PET_NAMES = ("Whiskers", "Spot", "Buddy", "Fluffy", "Coco", "Pip", "Sunny", "Patch", "Nibbles",
             "Rex", "Bubbles", "Ginger", "Oreo", "Pepper", "Honey", "Peanut", "Biscuit", "Tiny",
             "Snowy", "Dot", "Lucky", "Benny", "Toby", "Milo", "Bruno", "Hoppy", "Squeaky",
             "Goldie", "Button", "Cookie", "Maple", "Ziggy", "Pebble", "Rusty", "Bean", "Wally")

HUMAN_ADJS = ("little", "small", "happy", "kind", "curious", "cheerful", "brave", "shy",
              "playful", "clever", "sweet", "friendly")
HUMANS = (Kind("girl", HUMAN_ADJS, frozenset({"reach"}), human=True),
          Kind("boy", HUMAN_ADJS, frozenset({"reach"}), human=True))
ANIMALS = (
    Kind("cat", ("little", "fluffy", "orange", "gray", "sleepy", "curious"), frozenset({"climb"})),
    Kind("kitten", ("little", "tiny", "soft", "playful", "white"), frozenset({"climb"})),
    Kind("dog", ("big", "brown", "friendly", "happy", "spotted", "playful"),
         frozenset({"sniff", "swim"})),
    Kind("puppy", ("little", "happy", "fluffy", "brown", "silly"), frozenset({"sniff"})),
    Kind("bunny", ("little", "white", "fluffy", "quick", "soft"), frozenset({"sniff"})),
    Kind("bear", ("big", "brown", "friendly", "sleepy", "kind"),
         frozenset({"strong", "climb", "reach"})),
    Kind("duck", ("little", "yellow", "happy", "noisy"), frozenset({"swim", "fly"})),
    Kind("frog", ("small", "green", "jumpy", "happy"), frozenset({"swim"})),
    Kind("fox", ("clever", "red", "quick", "young"), frozenset({"sniff"})),
    Kind("mouse", ("tiny", "gray", "quick", "shy"), frozenset({"sniff"})),
    Kind("bird", ("little", "blue", "red", "happy", "tiny"), frozenset({"fly"})),
    Kind("squirrel", ("busy", "quick", "brown", "little"), frozenset({"climb"})),
    Kind("owl", ("wise", "old", "big", "brown"), frozenset({"fly"})),
    Kind("pig", ("pink", "happy", "little", "muddy"), frozenset({"sniff"})),
    Kind("horse", ("tall", "brown", "fast", "strong", "gentle"), frozenset({"strong"})),
    Kind("turtle", ("slow", "old", "little", "green", "wise"), frozenset({"swim"})),
    Kind("monkey", ("funny", "silly", "playful", "little"), frozenset({"climb"})),
    Kind("lamb", ("little", "white", "soft", "gentle"), frozenset()),
    Kind("giraffe", ("tall", "kind", "gentle", "young"), frozenset({"reach"})),
    Kind("elephant", ("big", "gray", "kind", "gentle", "strong"),
         frozenset({"reach", "strong", "swim"})),
    Kind("hedgehog", ("little", "prickly", "shy", "small"), frozenset({"sniff"})),
    Kind("deer", ("young", "gentle", "shy", "quick"), frozenset()),
)

THINGS = (
    Thing("ball", ("red", "big", "bouncy", "blue", "shiny", "yellow"),
          frozenset({"lose", "throw", "water"})),
    Thing("kite", ("red", "colorful", "big", "yellow", "green"), frozenset({"wind"})),
    Thing("teddy bear", ("soft", "brown", "old", "fluffy"), frozenset({"lose"})),
    Thing("toy car", ("red", "little", "fast", "shiny"), frozenset({"lose"})),
    Thing("doll", ("pretty", "little", "old", "soft"), frozenset({"lose"})),
    Thing("balloon", ("red", "blue", "big", "shiny", "green"), frozenset({"wind"})),
    Thing("hat", ("blue", "big", "straw", "funny", "red"), frozenset({"wind", "lose", "water"})),
    Thing("toy boat", ("little", "wooden", "red", "blue"), frozenset({"water", "lose"})),
    Thing("shell", ("pink", "pretty", "shiny", "small"), frozenset({"lose"})),
    Thing("ring", ("shiny", "gold", "little", "silver"), frozenset({"lose"})),
    Thing("scarf", ("warm", "red", "soft", "long"), frozenset({"wind", "lose"})),
    Thing("frisbee", ("yellow", "green", "orange", "red"), frozenset({"throw", "water"})),
    Thing("bucket", ("red", "blue", "little", "green"), frozenset({"lose"})),
    Thing("toy train", ("wooden", "little", "red", "long"), frozenset({"lose"})),
    Thing("toy robot", ("little", "silver", "shiny", "funny"), frozenset({"lose"})),
    Thing("whistle", ("shiny", "little", "silver", "loud"), frozenset({"lose"})),
    Thing("vase", ("pretty", "blue", "tall", "old"), frozenset({"break"})),
    Thing("cup", ("pretty", "white", "little", "blue"), frozenset({"break"})),
    Thing("lamp", ("tall", "yellow", "old", "pretty"), frozenset({"break"})),
    Thing("plate", ("big", "white", "pretty", "round"), frozenset({"break"})),
    Thing("jar", ("glass", "big", "old", "shiny"), frozenset({"break"})),
    Thing("clock", ("old", "round", "little", "wooden"), frozenset({"break"})),
)

FOODS = (
    Food("cookies", "bag", ("sweet", "big", "warm", "chocolate")),
    Food("apples", "basket", ("red", "juicy", "big", "green")),
    Food("cherries", "bowl", ("red", "sweet", "ripe")),
    Food("berries", "basket", ("sweet", "blue", "ripe", "juicy")),
    Food("candies", "box", ("sweet", "colorful", "little")),
    Food("grapes", "bunch", ("green", "sweet", "juicy", "purple")),
    Food("carrots", "bunch", ("orange", "crunchy", "fresh")),
    Food("cupcakes", "box", ("pink", "sweet", "little", "yummy")),
    Food("muffins", "plate", ("warm", "soft", "big", "yummy")),
    Food("nuts", "bag", ("crunchy", "little", "tasty")),
    Food("sandwiches", "basket", ("big", "tasty", "yummy")),
    Food("strawberries", "bowl", ("red", "sweet", "juicy", "big")),
)

PLACES = (
    Place("the park", "at the park",
          ("under a bench", "behind a big tree", "near the swings", "in the tall grass",
           "next to the slide", "under a pile of leaves"),
          ("play on the swings", "go down the slide", "run on the grass", "play tag"),
          ("The sun was shining and the birds were singing.",
           "There were many children playing on the grass.",
           "The trees were green and the flowers were bright."),
          frozenset({"tree"})),
    Place("the garden", "in the garden",
          ("under a big leaf", "behind the flowers", "next to the carrots", "in a bush",
           "near the old fence"),
          ("smell the flowers", "water the plants", "look for bugs", "dig in the dirt"),
          ("The flowers were red, yellow and pink.", "Bees were buzzing around the flowers.",
           "The garden was full of colors."),
          frozenset({"tree"})),
    Place("the forest", "in the forest",
          ("under a log", "behind a big rock", "in a hollow tree", "near a little stream",
           "under some leaves"),
          ("pick berries", "listen to the birds", "walk on the soft moss", "look for mushrooms"),
          ("The trees were very tall.", "Sunlight came down through the leaves.",
           "The forest was quiet and green."),
          frozenset({"tree", "water"})),
    Place("the beach", "at the beach",
          ("under the sand", "behind a big rock", "next to a sand castle", "near the water",
           "under a towel"),
          ("build sand castles", "look for shells", "splash in the waves", "dig in the sand"),
          ("The sand was warm and the water was blue.", "The waves went up and down.",
           "Seagulls were flying over the water."),
          frozenset({"water", "sand"})),
    Place("the meadow", "in the meadow",
          ("in the tall grass", "behind a big stone", "under a flower bush", "near a little hill"),
          ("pick flowers", "chase butterflies", "roll down the hill", "look at the clouds"),
          ("Butterflies were flying over the grass.", "The meadow was full of flowers.",
           "The grass was soft and green."),
          frozenset({"tree"})),
    Place("the pond", "by the pond",
          ("in the reeds", "under a lily pad", "near the water", "behind a rock"),
          ("watch the fish", "feed the ducks", "look at the frogs", "sit on the grass"),
          ("The water was calm and clear.", "Little fish were swimming in the water.",
           "Frogs were sitting on the lily pads."),
          frozenset({"water", "tree"})),
    Place("the farm", "on the farm",
          ("in the hay", "behind the barn", "near the fence", "under the old cart"),
          ("feed the chickens", "pet the cows", "ride on the hay", "look at the pigs"),
          ("The cows were eating grass and the chickens were pecking at the ground.",
           "The big red barn stood next to the field.", "The farm was busy and loud."),
          frozenset({"tree"})),
    Place("the backyard", "in the backyard",
          ("under the swing", "behind the shed", "in the sandbox", "next to the fence"),
          ("play in the sandbox", "jump on the grass", "swing on the swing", "play catch"),
          ("The grass was green and soft.", "A big oak tree stood in the middle of the yard.",
           "The sun was warm on the grass."),
          frozenset({"tree", "sand"})),
)

HOME_SPOTS = ("under the bed", "behind the sofa", "in the toy box", "under the rug",
              "in a drawer", "behind a big plant")
HOME_GAMES = ("build a fort with pillows", "play a board game", "draw pictures", "have a tea party",
              "make a puppet show", "play hide and seek", "bake cookies", "read a story")
HUMAN_HOMES = ("a small town", "a little village", "a quiet town", "a house near the woods",
               "a little house with a red door", "a big city")
ANIMAL_HOMES = ("a big forest", "a green meadow", "a quiet farm", "a sunny valley",
                "a cozy little hole", "the woods near a river")
HOBBIES = ("play outside", "run and jump", "sing songs", "play with friends", "look at the sky",
           "go on little adventures", "play games", "dance in the sun")
HUMAN_HOBBIES = ("draw pictures", "read books", "help at home", "ride a bike")
FEARS = (
    # (thing feared, the first brave act, what it turned out to be); the last fits children only
    ("the dark", "turned on a little light and looked around",
     "The dark room was just the same room as in the day."),
    ("the water", "put one foot in the water, then the other",
     "The water was cool and nice, and splashing was fun."),
    ("the big slide", "climbed up the ladder one step at a time",
     "Going down the slide was fast and fun."),
    ("thunder", "looked out the window and counted the seconds after the light",
     "The thunder was just a loud noise far away, and it could not hurt anyone."),
    ("the tall tree", "held on to the first branch and climbed slowly",
     "From the top of the tree, the whole world looked small and pretty."),
    ("the new school", "walked in and said hello to the teacher",
     "The other children were nice, and there were so many toys to play with."),
)
BUILDS = (
    # (what, where it fits, verb for falling down)
    ("a sand castle", "sand", "fell down when a wave came"),
    ("a tall tower of blocks", "home", "fell down with a big crash"),
    ("a little house of sticks", "tree", "fell over in the wind"),
    ("a snowman", "snow", "tipped over and broke into pieces"),
    ("a bridge of stones", "water", "fell into the water with a splash"),
)
GIFTS = ("a card with a big red heart", "a picture of the whole family", "a necklace of flowers",
         "a little cake", "a paper crown", "a basket of wild flowers")
# (food, whether it takes a plural verb)
VEGETABLES = (("peas", True), ("carrots", True), ("broccoli", False), ("beans", True),
              ("spinach", False), ("fish soup", False), ("mushrooms", True))
