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
              "Ellie", "Nina", "Clara", "Poppy", "Alice", "Lola", "Mila", "Rose", "Fiona", "Greta",
              "Hazel", "Iris", "Josie", "Lara", "Mae", "Nell", "Pia", "Rita", "Stella", "Tess",
              "Vera", "Wendy", "Zara", "Abby", "Beth", "Cora", "Dora", "Eva", "Freya", "Gemma",
              "Holly", "Jade", "Kira", "Luna", "Megan")
BOY_NAMES = ("Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Finn", "Jake", "Noah", "Oliver",
             "Luke", "Adam", "Ryan", "Eli", "Theo", "Danny", "Mark", "Joe", "Owen", "Henry",
             "Billy", "Peter", "Alex", "Jimmy", "Kevin", "Lucas", "Paul", "Ned", "Bob", "Charlie",
             "Dan", "Ethan", "Hugo", "Ian", "Oscar", "Arlo", "Bruce", "Carl", "Dylan", "Eddie",
             "Felix", "George", "Harry", "Jonah", "Kai", "Liam", "Miles", "Nick", "Otto", "Pete",
             "Quinn", "Rory", "Seth", "Toby", "Victor", "Will", "Zack", "Andy", "Blake", "Cody",
             "Drew", "Evan", "Fred", "Gus", "Jasper")
PET_NAMES = ("Whiskers", "Spot", "Buddy", "Fluffy", "Coco", "Pip", "Sunny", "Patch", "Nibbles",
             "Rex", "Bubbles", "Ginger", "Oreo", "Pepper", "Honey", "Peanut", "Biscuit", "Tiny",
             "Snowy", "Dot", "Lucky", "Benny", "Toby", "Milo", "Bruno", "Hoppy", "Squeaky",
             "Goldie", "Button", "Cookie", "Maple", "Ziggy", "Pebble", "Rusty", "Bean", "Wally",
             "Puddles", "Fuzzy", "Sparky", "Twinkle", "Mittens", "Pickles", "Shadow", "Smudge",
             "Sprout", "Waffles", "Acorn", "Bramble", "Clover", "Dusty", "Flick", "Gizmo", "Jelly",
             "Noodle", "Olly", "Pumpkin", "Rascal", "Scout", "Tofu", "Velvet", "Wiggles", "Yoyo")

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
    Kind("goat", ("little", "white", "hungry", "funny"), frozenset({"climb"})),
    Kind("goose", ("white", "loud", "big", "proud"), frozenset({"swim", "fly"})),
    Kind("raccoon", ("clever", "gray", "curious", "little"), frozenset({"climb", "sniff"})),
    Kind("beaver", ("busy", "brown", "strong", "clever"), frozenset({"swim", "strong"})),
    Kind("otter", ("playful", "sleek", "happy", "little"), frozenset({"swim"})),
    Kind("panda", ("big", "sleepy", "gentle", "fluffy"), frozenset({"climb", "strong"})),
    Kind("kangaroo", ("tall", "jumpy", "quick", "young"), frozenset({"strong"})),
    Kind("penguin", ("little", "funny", "happy", "small"), frozenset({"swim"})),
    Kind("chick", ("tiny", "yellow", "fluffy", "little"), frozenset()),
    Kind("parrot", ("green", "colorful", "noisy", "clever"), frozenset({"fly"})),
    Kind("snail", ("slow", "little", "shy", "tiny"), frozenset()),
    Kind("badger", ("gray", "strong", "grumpy", "old"), frozenset({"sniff", "strong"})),
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
    Thing("paper plane", ("white", "little", "fast", "folded"), frozenset({"wind", "throw"})),
    Thing("toy drum", ("red", "little", "loud", "shiny"), frozenset({"lose"})),
    Thing("blanket", ("soft", "warm", "blue", "old"), frozenset({"lose", "wind"})),
    Thing("book", ("new", "old", "big", "funny"), frozenset({"lose"})),
    Thing("crayon box", ("new", "big", "colorful", "little"), frozenset({"lose"})),
    Thing("bubble wand", ("pink", "long", "magic", "little"), frozenset({"lose", "water"})),
    Thing("sock monkey", ("old", "funny", "soft", "striped"), frozenset({"lose", "throw"})),
    Thing("rubber duck", ("yellow", "little", "squeaky", "happy"), frozenset({"lose", "water"})),
    Thing("beanbag", ("red", "soft", "little", "heavy"), frozenset({"throw", "lose"})),
    Thing("flag", ("bright", "little", "red", "striped"), frozenset({"wind"})),
    Thing("teapot", ("white", "round", "pretty", "old"), frozenset({"break"})),
    Thing("mirror", ("round", "little", "old", "shiny"), frozenset({"break"})),
    Thing("bowl", ("blue", "big", "pretty", "painted"), frozenset({"break"})),
    Thing("piggy bank", ("pink", "round", "heavy", "little"), frozenset({"break"})),
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
    Food("pancakes", "plate", ("warm", "fluffy", "big", "sweet")),
    Food("plums", "basket", ("purple", "ripe", "juicy", "sweet")),
    Food("pears", "basket", ("green", "ripe", "sweet", "big")),
    Food("crackers", "box", ("crunchy", "salty", "little", "round")),
    Food("peaches", "bowl", ("soft", "ripe", "juicy", "sweet")),
    Food("biscuits", "tin", ("warm", "sweet", "crunchy", "little")),
    Food("oranges", "bag", ("big", "juicy", "sweet", "round")),
    Food("donuts", "box", ("sweet", "pink", "sticky", "warm")),
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
    Place("the lake", "by the lake",
          ("under the dock", "behind a big rock", "in the reeds", "near the old boat",
           "under a willow tree"),
          ("skip stones", "watch the boats", "look for frogs", "dip their toes in the water"),
          ("The lake was blue and still.", "A little boat was floating on the water.",
           "Ducks were swimming near the shore."),
          frozenset({"water", "tree"})),
    Place("the hill", "on the hill",
          ("behind a big rock", "in the tall grass", "under a bush", "near the old gate"),
          ("roll down the hill", "fly a kite", "look at the town below", "pick daisies"),
          ("From the top, they could see the whole town.", "The wind was soft and cool.",
           "White clouds sailed across the sky."),
          frozenset({"tree"})),
    Place("the playground", "at the playground",
          ("under the slide", "behind the seesaw", "in the sandbox", "next to the bench",
           "near the monkey bars"),
          ("go down the slide", "play on the seesaw", "climb the monkey bars", "play tag"),
          ("Children were laughing and running everywhere.", "The swings went high and low.",
           "The slide was shiny in the sun."),
          frozenset({"tree", "sand"})),
    Place("the river", "by the river",
          ("under a log", "behind a rock", "in the mud", "near the little bridge",
           "under the ferns"),
          ("throw pebbles", "watch the fish jump", "walk along the bank", "build a little dam"),
          ("The river went splash and gurgle over the stones.", "A heron stood in the water.",
           "The water sparkled in the sun."),
          frozenset({"water", "tree"})),
    Place("the orchard", "in the orchard",
          ("under an apple tree", "behind a basket", "in the tall grass", "near the ladder",
           "under a pile of leaves"),
          ("pick apples", "climb the low branches", "count the pears", "sit in the shade"),
          ("The trees were full of red apples.", "The air smelled sweet like fruit.",
           "Bees were buzzing from tree to tree."),
          frozenset({"tree"})),
    Place("the town square", "in the town square",
          ("under a bench", "near the fountain", "behind a flower pot", "next to the big clock"),
          ("feed the pigeons", "watch the fountain", "listen to the music", "play hopscotch"),
          ("The fountain splashed in the middle of the square.",
           "People were walking and talking everywhere.", "A man was playing a happy song."),
          frozenset({"tree"})),
)

HOME_SPOTS = ("under the bed", "behind the sofa", "in the toy box", "under the rug",
              "in a drawer", "behind a big plant", "in the closet", "under a pillow",
              "behind the curtain", "in an old shoe box")
HOME_GAMES = ("build a fort with pillows", "play a board game", "draw pictures", "have a tea party",
              "make a puppet show", "play hide and seek", "bake cookies", "read a story",
              "build a tower of cups", "play dress up", "make paper boats", "sing silly songs")
HUMAN_HOMES = ("a small town", "a little village", "a quiet town", "a house near the woods",
               "a little house with a red door", "a big city", "a house by the sea",
               "a yellow house on a hill", "a busy street", "a farm house")
ANIMAL_HOMES = ("a big forest", "a green meadow", "a quiet farm", "a sunny valley",
                "a cozy little hole", "the woods near a river", "a hollow log",
                "a nest in a tall tree", "a barn full of hay", "a hill of soft grass")
HOBBIES = ("play outside", "run and jump", "sing songs", "play with friends", "look at the sky",
           "go on little adventures", "play games", "dance in the sun", "splash in puddles",
           "watch the clouds", "collect pretty stones", "tell jokes", "make new friends")
HUMAN_HOBBIES = ("draw pictures", "read books", "help at home", "ride a bike", "paint",
                 "play the drums", "build with blocks", "plant flowers")
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
         "a little cake", "a paper crown", "a basket of wild flowers", "a bracelet of beads",
         "a clay cup", "a song about the sun", "a painted stone", "a box of paper stars")
# (food, whether it takes a plural verb)
VEGETABLES = (("peas", True), ("carrots", True), ("broccoli", False), ("beans", True),
              ("spinach", False), ("fish soup", False), ("mushrooms", True),
              ("green beans", True), ("cabbage", False), ("onion soup", False),
              ("peppers", True), ("radishes", True))

COLORS = ("red", "blue", "green", "yellow", "purple", "pink", "orange", "white", "brown", "gray",
          "silver", "gold", "black", "striped", "spotted")
# What a hero wears every day (children, then animals): the detail a story opens with and recalls.
HUMAN_WEARABLES = ("hat", "scarf", "coat", "boots", "cap", "sweater", "backpack", "raincoat",
                   "mittens", "bow")
ANIMAL_WEARABLES = ("collar", "bow", "bell", "scarf", "ribbon")
PLURAL_WEARABLES = frozenset({"boots", "mittens"})
WEATHERS = ("sunny", "windy", "cold", "warm", "bright", "cloudy", "foggy", "quiet", "lovely",
            "fine")
TIMES = ("morning", "afternoon", "evening", "day")
# (thing taken on a trip, what is done with it there: "{He} <use>.")
TRIP_ITEMS = (
    ("a red blanket", "spread the red blanket on the grass"),
    ("a bottle of water", "drank some cool water from the bottle"),
    ("a big sandwich", "ate the big sandwich in three bites"),
    ("a little shovel", "dug a hole with the little shovel"),
    ("a jar for bugs", "caught a beetle in the jar and then let it go"),
    ("a book of animals", "read about owls in the book of animals"),
    ("a warm sweater", "put on the warm sweater when the wind came"),
    ("a box of crayons", "drew a picture with the crayons"),
    ("a bag of seeds", "threw some seeds to the birds"),
    ("a kite", "flew the kite high in the sky"),
    ("a little net", "caught a tiny fish with the net and put it back"),
    ("an apple", "ate the apple and saved the seeds"),
    ("a flashlight", "looked into a dark hole with the flashlight"),
    ("a ball", "played catch with the ball"),
    ("a map", "looked at the map to find the way"),
    ("a whistle", "blew the whistle, and a bird whistled back"),
)
# (singular, plural) things that can be counted in a story
COUNTABLES = (("apple", "apples"), ("cookie", "cookies"), ("shell", "shells"),
              ("marble", "marbles"), ("flower", "flowers"), ("egg", "eggs"),
              ("berry", "berries"), ("stone", "stones"), ("balloon", "balloons"),
              ("star", "stars"), ("carrot", "carrots"), ("cupcake", "cupcakes"),
              ("button", "buttons"), ("acorn", "acorns"), ("leaf", "leaves"))
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve")
# Scenery: (singular, plural, adjectives, what they did). Past tense, so one verb fits one or many.
CRITTERS = (
    ("bird", "birds", ("little", "tiny", "blue", "brown", "happy"),
     ("sang in the trees", "flew over the roofs", "hopped on the grass", "sat on a branch")),
    ("butterfly", "butterflies", ("white", "yellow", "colorful", "little", "orange"),
     ("danced over the flowers", "landed on a leaf", "flew by in the sun")),
    ("bee", "bees", ("busy", "fuzzy", "little", "golden"),
     ("buzzed around the flowers", "flew from bloom to bloom", "hummed in the warm air")),
    ("squirrel", "squirrels", ("busy", "brown", "gray", "quick"),
     ("ran up a tree", "played with an acorn", "chased each other around a tree")),
    ("duck", "ducks", ("white", "little", "noisy", "brown"),
     ("walked by in a line", "quacked at the sky", "waddled past")),
    ("cloud", "clouds", ("white", "fluffy", "big", "soft", "gray"),
     ("drifted across the sky", "looked like sheep", "sailed slowly by")),
    ("dog", "dogs", ("friendly", "big", "little", "spotted"),
     ("barked far away", "ran after a ball", "wagged their tails")),
    ("leaf", "leaves", ("red", "yellow", "brown", "green", "dry"),
     ("fell from the trees", "danced in the wind", "blew across the path")),
    ("frog", "frogs", ("green", "little", "jumpy", "spotted"),
     ("croaked nearby", "jumped into the water", "sat on a stone")),
    ("kite", "kites", ("red", "colorful", "big", "long"),
     ("flew high in the sky", "danced in the wind", "went up and down")),
)
# How a hero looks: (first words, what they describe, eye colours), e.g.
# "curly red hair and green eyes".
HUMAN_LOOKS = (("curly", "straight", "short", "long", "messy", "soft"),
               ("red hair", "brown hair", "black hair", "yellow hair"),
               ("green", "blue", "brown", "gray", "big brown", "bright blue"))
ANIMAL_LOOKS = (("soft", "thick", "shiny", "fluffy", "spotted", "striped"),
                ("brown fur", "white fur", "gray fur", "orange fur", "black fur"),
                ("green", "black", "brown", "yellow", "big round", "bright"))
