#!/usr/bin/env python
"""Build the project's calibration and evaluation data from handwritten material.

Everything in calibration_data/ and eval/ is produced by this script from the text written below
(paragraphs, conversations, code, word problems, vocabularies). Nothing is downloaded. The builder is
seeded, so running it again reproduces the committed JSONL byte for byte:

    .venv/bin/python scripts/build_data.py            # write calibration_data/ and eval/
    .venv/bin/python scripts/build_data.py --check    # rebuild in memory, fail if the files differ
    .venv/bin/python scripts/build_data.py --table    # print counts per domain x length bucket

Disjointness by construction: every pool of handwritten material is split once into a calibration part
and an evaluation part (`_split`), and evaluation samples are only composed from the evaluation part.
As a safety net, an eval sample that still shares a 50-character substring or a 13-word n-gram with any
calibration sample is dropped (the test in tests/test_data_disjoint.py checks the same thing).

Licence: written for this project, Apache-2.0 like the rest of accel.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ("chat", "code", "math", "prose", "structured", "multilingual")
TASKS = ("arithmetic", "json_extraction", "multiple_choice", "formatting", "factual")
# Bucket upper bounds in tokens (the last bucket is open-ended); the same as CalibrationConfig's default.
BUCKETS = (64, 256, 1024)
# Calibration samples wanted per length bucket (<=64, 65-256, 257-1024, >1024) in every domain.
CAL_PLAN = (30, 48, 48, 8)
# Eval text samples per bucket: mostly 128-1024 tokens, for perplexity / KL over fixed windows.
EVAL_PLAN = ((128, 256, 10), (257, 1024, 22))
SEED = 20261129

# ----------------------------------------------------------------------------------------------------
# Prose: handwritten paragraphs, each with a one-sentence summary (used for the summarization format).
# ----------------------------------------------------------------------------------------------------
PROSE = [
    ("Honeybees communicate the location of food through a dance whose angle and duration encode direction and distance.",
     "When a forager honeybee finds a rich patch of flowers, she returns to the hive and performs what "
     "biologists call the waggle dance. She walks a short straight line while shaking her abdomen, then "
     "loops back and repeats the run. The angle of the straight run relative to vertical tells her sisters "
     "the direction of the flowers relative to the sun, and the length of the waggle tells them how far to "
     "fly. Karl von Frisch spent decades decoding this behaviour, and his work earned a share of the Nobel "
     "Prize in 1973. Later experiments with robotic bees confirmed that the dance alone is enough to send "
     "recruits to the right place."),
    ("The printing press made books cheaper and helped spread new ideas across Europe.",
     "Before the middle of the fifteenth century, most books in Europe were copied by hand, a slow process "
     "that kept them rare and expensive. Johannes Gutenberg combined movable metal type, an oil-based ink "
     "and a screw press adapted from wine making, and the result changed the economics of the written word. "
     "Within fifty years, presses were running in more than two hundred cities. Pamphlets, grammars, maps "
     "and scientific treatises could now reach readers who had never owned a book, and scholars in distant "
     "towns could argue over identical copies of the same text."),
    ("Sourdough bread rises because wild yeast and bacteria in the starter ferment the dough slowly.",
     "A sourdough starter is nothing more than flour and water that has been left to ferment, fed regularly "
     "until a stable community of wild yeast and lactic acid bacteria takes hold. The yeast produces carbon "
     "dioxide, which inflates the dough, while the bacteria produce acids that give the bread its tang and "
     "help it keep longer. Because the fermentation is slower than with commercial yeast, bakers often mix "
     "the dough in the evening and bake it the next morning. The long rest also lets enzymes break down "
     "part of the starch, which deepens the colour of the crust."),
    ("Coral reefs are built by tiny animals and are threatened by warming oceans.",
     "A coral reef may look like rock, but it is the work of colonies of small animals called polyps. Each "
     "polyp secretes a skeleton of calcium carbonate, and over thousands of years these skeletons pile up "
     "into structures large enough to be seen from space. Most reef-building corals depend on algae living "
     "inside their tissues, which supply sugars from photosynthesis. When the water stays too warm for too "
     "long, the corals expel the algae and turn white, an event known as bleaching. A reef can recover from "
     "a single episode, but repeated heat waves leave it little time to regrow."),
    ("Compound interest makes savings grow faster over time because interest is earned on past interest.",
     "Suppose you put money in an account that pays five percent a year and you never withdraw the "
     "interest. In the first year you earn five percent of what you deposited. In the second year you earn "
     "five percent of a slightly larger amount, because last year's interest is now part of the balance. "
     "The difference looks tiny at first, yet over decades it adds up: at that rate the balance roughly "
     "doubles every fourteen years. This is why financial advisers tell young people that the time they "
     "start saving matters more than the exact amount they put away each month."),
    ("The Silk Road was a network of trade routes that carried goods, religions and technologies between Asia and Europe.",
     "The name Silk Road suggests a single highway, but it was really a shifting web of caravan tracks, "
     "river crossings and sea lanes linking China, Central Asia, Persia and the Mediterranean. Silk was only "
     "one of many goods on the move; merchants also carried spices, glass, horses, paper and precious "
     "metals. Few traders ever travelled the whole distance. Instead, goods passed from hand to hand through "
     "oasis cities such as Samarkand and Kashgar. Along with merchandise came ideas: Buddhism spread east "
     "along these routes, and papermaking eventually travelled west."),
    ("Sleep helps the brain store memories and clear waste, so losing sleep harms learning.",
     "Researchers once thought of sleep as a simple pause, but it turns out to be busy work for the brain. "
     "During deep sleep, patterns of activity recorded while learning during the day are replayed, which "
     "seems to help move new memories into long-term storage. The fluid that bathes the brain also flows "
     "more freely at night, washing away waste products that build up while we are awake. Students who "
     "stay up all night before an exam often remember less than those who study less but sleep well, a "
     "result that has been repeated in many laboratory studies."),
    ("Lighthouses once relied on keepers and clever lenses to warn ships away from danger.",
     "For centuries, a lighthouse was only as good as the person who tended it. Keepers trimmed wicks, "
     "polished glass and wound the clockwork that turned the lamp, often living for months on a rock with "
     "their families. The invention of the Fresnel lens in the 1820s made their work far more effective: "
     "by arranging rings of glass prisms around a single flame, it gathered light that would have been "
     "wasted and threw it many miles out to sea. Today most lighthouses are automated, and satellite "
     "navigation has taken over much of their old job."),
    ("Volcanoes form where molten rock escapes through the crust, and their eruptions depend on how sticky the magma is.",
     "Not all volcanoes behave alike. In Hawaii, the magma is runny and low in silica, so gas escapes "
     "easily and lava pours out in long glowing rivers that visitors can watch from a safe distance. In "
     "places like Mount St. Helens, the magma is thick and rich in silica, and gas stays trapped until the "
     "pressure becomes enormous. When such a volcano finally erupts, it can blast ash high into the "
     "atmosphere and send avalanches of hot gas and rock racing down its slopes. Geologists watch for "
     "swelling ground and small earthquakes to judge when trouble is coming."),
    ("City parks improve health and cool the surrounding streets.",
     "Urban planners increasingly treat parks as infrastructure rather than decoration. Trees shade "
     "pavements and release water vapour, which can make a park several degrees cooler than the streets "
     "around it on a summer afternoon. Green space also encourages people to walk, run and meet their "
     "neighbours, and studies link regular visits to lower stress and better sleep. Even small pocket parks "
     "squeezed between buildings can help. The challenge for cities is to spread these benefits fairly, "
     "since poorer neighbourhoods often have the fewest trees."),
    ("The Apollo 11 mission landed the first people on the Moon in July 1969.",
     "On 20 July 1969, the lunar module Eagle touched down in the Sea of Tranquility with Neil Armstrong "
     "and Buzz Aldrin on board, while Michael Collins orbited overhead in the command module. The landing "
     "was tense: alarms flashed on the guidance computer, and Armstrong had to steer past a field of "
     "boulders with little fuel to spare. A few hours later he stepped onto the surface, followed by "
     "Aldrin. The two men collected rock samples, planted a flag and set up experiments before rejoining "
     "Collins for the trip home."),
    ("Octopuses are intelligent animals that can solve puzzles and change colour in an instant.",
     "An octopus has about five hundred million neurons, many of them spread through its eight arms, which "
     "can taste and touch on their own. In aquariums, octopuses have learned to unscrew jar lids, escape "
     "through tiny gaps and squirt water at keepers they dislike. Their skin contains thousands of "
     "pigment cells controlled by muscles, allowing them to change colour and texture in a fraction of a "
     "second to match a rock or a patch of seaweed. Strangely, most species live only a year or two, so "
     "all of this cleverness is learned in a very short life."),
    ("Recycling saves resources only when materials are sorted well and there is a market for them.",
     "Putting a bottle in the recycling bin feels like the end of the story, but it is really the start of "
     "a long chain. The bottle is collected, sorted by machines and people, cleaned, shredded and melted "
     "before it can become something new. If the bin is contaminated with food or the wrong kind of "
     "plastic, whole loads may be sent to landfill instead. Aluminium cans are the great success of the "
     "system, because remelting them uses a small fraction of the energy needed to make new metal. Many "
     "plastics, by contrast, lose quality each time they are recycled."),
    ("Jazz grew out of New Orleans in the early twentieth century and prizes improvisation.",
     "Jazz took shape in New Orleans, a port city where African American blues and spirituals met brass "
     "band marches, ragtime piano and Caribbean rhythms. Early bands played for parades, dances and "
     "funerals, and musicians such as Louis Armstrong turned the solo into the centre of the music. What "
     "sets jazz apart is improvisation: players agree on a melody and a chord sequence, then invent new "
     "lines on the spot, answering one another like people in a lively conversation. The style has split "
     "into many branches since then, from swing and bebop to fusion."),
    ("Glaciers shape landscapes by carving valleys and leaving behind piles of rock.",
     "A glacier is a river of ice that moves under its own weight, sometimes only a few centimetres a day. "
     "As it flows, it plucks rocks from the ground and drags them along its base, grinding the valley floor "
     "like sandpaper. Valleys cut by rivers tend to have a V shape, while those carved by glaciers are wide "
     "U shapes with steep walls. When the ice melts back, it drops the rubble it was carrying in ridges "
     "called moraines. Many lakes in northern Europe and North America sit in hollows scooped out by ice "
     "during the last glacial period."),
    ("Vaccines train the immune system to recognise a germ without causing the disease.",
     "A vaccine shows the immune system a harmless piece or copy of a germ, such as a weakened virus, an "
     "inactivated toxin or a single protein from the surface of a bacterium. The body responds as if it "
     "had met the real thing, producing antibodies and memory cells. If the actual germ arrives later, "
     "those memory cells recognise it quickly and mount a strong defence before the infection can take "
     "hold. When enough people in a community are vaccinated, a disease struggles to spread at all, which "
     "also protects babies and others who cannot be vaccinated themselves."),
    ("A good night market in Taipei offers cheap food, games and a lively crowd.",
     "As the sun goes down in Taipei, quiet streets fill with stalls, steam and the smell of frying "
     "dough. Night markets are where many residents eat dinner, moving from one vendor to the next for a "
     "bowl of beef noodle soup, a skewer of grilled squid or a cup of bubble tea. Between the food stalls "
     "there are games where children throw rings at bottles and adults try to win stuffed toys. Prices are "
     "low and portions are small, which encourages visitors to try a little of everything before the "
     "crowds thin out around midnight."),
    ("Bridges carry loads in different ways: beams bend, arches push outward and suspension cables pull.",
     "Engineers choose a bridge design by thinking about how the load will travel to the ground. A simple "
     "beam bridge bends under weight, so its top is squeezed while its bottom is stretched, which limits "
     "how far it can span. An arch turns the load into compression that pushes outward against its "
     "supports, which is why stone arches built by the Romans still stand. A suspension bridge hangs the "
     "deck from cables draped between tall towers, and the cables carry the weight in tension to anchors "
     "buried at each end. That arrangement lets suspension bridges cross the widest gaps."),
    ("Chess engines became stronger than the best human players by searching millions of positions per second.",
     "In 1997 the computer Deep Blue defeated the world champion Garry Kasparov in a six-game match, a "
     "moment that made headlines around the world. Deep Blue relied on custom hardware that examined "
     "around two hundred million positions every second, guided by an evaluation function tuned with the "
     "help of grandmasters. Two decades later, programs that taught themselves by playing millions of games "
     "against their own copies reached an even higher level. Today a free engine running on a phone can "
     "beat any human, and professionals use engines to prepare their openings."),
    ("Tea is made from the leaves of a single plant, and processing determines whether it becomes green, oolong or black.",
     "Green tea, oolong and black tea all come from the same shrub, Camellia sinensis. The difference lies "
     "in what happens after the leaves are picked. For green tea, the leaves are heated soon after harvest, "
     "which stops the enzymes that would darken them. For black tea, the leaves are rolled and left to "
     "oxidise fully, turning them brown and giving a stronger, maltier flavour. Oolong sits in between, "
     "partly oxidised and often rolled into tight balls that unfurl in hot water. Herbal drinks such as "
     "peppermint or chamomile are not tea in the strict sense at all."),
    ("Maps always distort the round Earth, and each projection chooses which distortion to accept.",
     "It is impossible to flatten the surface of a sphere without stretching or tearing it, so every flat "
     "map of the world makes a compromise. The Mercator projection, designed for sailors, keeps angles "
     "correct so that a straight line on the map is a constant compass bearing, but it badly inflates areas "
     "near the poles: Greenland looks as large as Africa, although Africa is about fourteen times bigger. "
     "Equal-area projections fix the sizes but bend the shapes. Choosing a projection therefore depends on "
     "what the map is for."),
    ("The human heart pumps blood through two circuits, one to the lungs and one to the rest of the body.",
     "The heart is really two pumps working side by side. The right side receives blood that has given up "
     "its oxygen to the body and sends it to the lungs, where it picks up fresh oxygen and releases carbon "
     "dioxide. The left side receives this oxygen-rich blood and pushes it out through the aorta to every "
     "organ, which is why its muscular wall is much thicker. Valves between the chambers keep the blood "
     "moving in one direction, and their closing produces the familiar sound of a heartbeat. At rest, an "
     "adult heart beats roughly sixty to eighty times a minute."),
    ("Public libraries now lend tools, seeds and internet access as well as books.",
     "Walk into a modern public library and you may find far more than shelves of novels. Many branches "
     "lend laptops and wireless hotspots to people who cannot afford a connection at home. Some run seed "
     "libraries where gardeners borrow seeds in spring and return seeds from their own harvest in autumn. "
     "Others lend sewing machines, telescopes or power drills, and host classes on writing a CV or filling "
     "in tax forms. Librarians describe their buildings as one of the few indoor public spaces where "
     "nobody is expected to buy anything."),
    ("Wind turbines turn moving air into electricity, and larger blades capture far more energy.",
     "A wind turbine works like a fan in reverse. The wind pushes on the shaped blades, which turn a shaft "
     "connected to a generator inside the housing at the top of the tower. The energy available grows with "
     "the cube of the wind speed, so a site where the wind blows twice as fast offers about eight times as "
     "much power. It also grows with the area swept by the blades, which is why modern offshore turbines "
     "have blades longer than a football pitch. Because the wind does not blow all the time, grids pair "
     "turbines with other sources and with storage."),
    ("The Great Fire of London in 1666 destroyed much of the city but led to safer building rules.",
     "In September 1666 a fire broke out in a bakery on Pudding Lane and, driven by a strong east wind, "
     "spread through the crowded wooden houses of the old city for four days. It destroyed more than "
     "thirteen thousand houses, dozens of churches and the medieval St Paul's Cathedral. Surprisingly few "
     "deaths were recorded, although the true number is uncertain. After the disaster, new regulations "
     "required buildings to be made of brick or stone, streets were widened, and Christopher Wren designed "
     "a new cathedral that still dominates the skyline."),
    ("Birds migrate thousands of kilometres using the sun, the stars and the Earth's magnetic field.",
     "Every autumn, billions of birds leave their breeding grounds and fly south to places where food is "
     "easier to find in winter. Some of the journeys are astonishing: the Arctic tern travels from the far "
     "north to Antarctica and back each year. To find their way, birds seem to use several compasses at "
     "once. They read the position of the sun during the day and the pattern of stars at night, and "
     "experiments suggest they can also sense the Earth's magnetic field. Young birds on their first "
     "migration often follow experienced adults."),
    ("Good sleep habits include a regular schedule, a dark room and less screen time before bed.",
     "Doctors who treat insomnia usually start with habits rather than pills. Going to bed and getting up "
     "at the same time every day, even at weekends, helps set the body clock. A bedroom that is cool, dark "
     "and quiet makes it easier to fall asleep, and heavy curtains or an eye mask can help in summer. "
     "Caffeine lingers in the body for hours, so an afternoon coffee may still be working at midnight. "
     "Bright screens late in the evening also delay sleep, and many people find that reading a paper book "
     "for twenty minutes is a gentler way to wind down."),
    ("The Rosetta Stone allowed scholars to decipher Egyptian hieroglyphs because it carried the same text in three scripts.",
     "French soldiers found the Rosetta Stone in 1799 while rebuilding a fort in the Nile delta. The slab "
     "carries a decree issued in 196 BC, written three times: in hieroglyphs, in the everyday Egyptian "
     "script called Demotic, and in ancient Greek. Because scholars could read the Greek, they had a key to "
     "the other two. Jean-Francois Champollion finally showed in 1822 that hieroglyphs combined sound signs "
     "with picture signs, opening up thousands of years of Egyptian records. The stone has been on display "
     "in the British Museum since 1802."),
    ("Remote work saves commuting time but makes it harder for new employees to learn from colleagues.",
     "When offices closed during the pandemic, many companies discovered that a large share of their work "
     "could be done from kitchen tables. Employees gained hours that used to be lost in traffic, and some "
     "firms cut the cost of renting space. The picture is more mixed for people early in their careers, "
     "who often learn by overhearing experienced colleagues and asking quick questions across a desk. Many "
     "organisations have settled on a hybrid pattern, with a few days together for meetings and mentoring "
     "and the rest at home for focused work."),
    ("Penguins survive the Antarctic cold thanks to dense feathers, fat and huddling.",
     "Emperor penguins breed in the middle of the Antarctic winter, when temperatures can fall below minus "
     "forty degrees and winds howl across the ice. Their bodies are built for it: a thick layer of fat, "
     "tightly packed waterproof feathers and a clever arrangement of blood vessels in the legs that keeps "
     "heat from escaping through the feet. The males incubate the single egg on their feet for about two "
     "months without eating. To save energy they huddle together in groups of thousands, slowly rotating "
     "so that each bird takes a turn in the warm centre."),
    ("Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar and oxygen.",
     "Inside the leaves of a plant, tiny structures called chloroplasts capture energy from sunlight using "
     "the green pigment chlorophyll. That energy is used to split water molecules, releasing oxygen as a "
     "by-product, and to build sugars from carbon dioxide taken in through small pores on the leaf. The "
     "sugars feed the plant and become the starting material for wood, fruit and seeds. Almost all the "
     "food we eat depends on this process, directly or through the animals that eat plants, and the oxygen "
     "in the air was released by photosynthesis over billions of years."),
    ("Mountaineers at high altitude risk altitude sickness because the air holds less oxygen.",
     "At the summit of Mount Everest, each breath contains only about a third of the oxygen available at "
     "sea level. Climbers who ascend too quickly can develop headaches, nausea and exhaustion, and in severe "
     "cases fluid builds up in the lungs or the brain, which can be fatal. The usual defence is patience: "
     "climbers spend weeks moving up and down between camps so that their bodies produce more red blood "
     "cells. The rule of thumb is to climb high and sleep low, and to descend at once if symptoms grow "
     "worse."),
    ("Open-source software is written in public and can be reused by anyone under its licence.",
     "Much of the software that runs the internet is open source, meaning its code is published for anyone "
     "to read, change and share. Volunteers and paid developers from many companies contribute fixes and "
     "features, often reviewing each other's work through public discussions. A licence sets the terms: "
     "some only ask that the original copyright notice be kept, while others require that modified "
     "versions be shared under the same conditions. Projects succeed when they attract a healthy community, "
     "and many struggle when a single tired maintainer carries most of the load."),
    ("Salt was so valuable in the past that it shaped trade routes and the words we use.",
     "Before refrigeration, salt was the main way to preserve meat and fish through the winter, which made "
     "it one of the most traded goods in the world. Caravans carried slabs of salt across the Sahara to "
     "exchange for gold, and cities such as Salzburg grew rich on nearby mines. Governments taxed it "
     "heavily, and protests against salt taxes appear again and again in history, from France before the "
     "Revolution to Gandhi's march to the sea in 1930. The word salary is often linked to the Latin word "
     "for salt, though historians debate the exact story."),
    ("Rainbows appear when sunlight is bent and reflected inside raindrops, splitting into colours.",
     "To see a rainbow, you must stand with the sun behind you and rain in front of you. Each raindrop "
     "acts like a tiny prism: light entering the drop bends, reflects off the back and bends again on the "
     "way out. Because different colours bend by slightly different amounts, white sunlight spreads into a "
     "band of red, orange, yellow, green, blue and violet, with red on the outside of the arc. Sometimes a "
     "fainter second bow appears above the first, with its colours in the reverse order, caused by light "
     "reflecting twice inside the drops."),
    ("Football became the world's most popular sport after its rules were written down in England in 1863.",
     "People have kicked balls around for thousands of years, but modern football traces its rules to a "
     "meeting of clubs in a London tavern in 1863, where the Football Association agreed to ban carrying "
     "the ball by hand. British sailors, engineers and students then spread the game to ports and cities "
     "around the world, and by the early twentieth century it was being played across South America and "
     "Europe. The first World Cup took place in Uruguay in 1930. Its simplicity helps explain its reach: "
     "all you really need is a ball and some open ground."),
    ("Earthquakes happen when stress builds up along faults and is released suddenly.",
     "The outer shell of the Earth is broken into plates that grind slowly past one another. Along the "
     "boundaries, the rocks often stick instead of sliding smoothly, and strain builds up for years or "
     "centuries. When the rocks finally slip, the stored energy is released as seismic waves that shake "
     "the ground. The magnitude scale is logarithmic, so each whole number represents roughly thirty-two "
     "times more energy. Scientists cannot yet predict the exact day of an earthquake, but they can map "
     "risky areas and help cities write building codes that keep structures standing."),
    ("Learning a musical instrument as an adult is slower but still very possible with regular practice.",
     "Many adults believe the chance to learn an instrument passed when they left school, yet teachers "
     "report steady progress from beginners in their forties and beyond. Adults often lack the free time of "
     "children and may feel more self-conscious about mistakes, but they bring patience, a clearer idea of "
     "what music they love and the ability to plan their practice. Short daily sessions work better than a "
     "long weekly one, because the brain consolidates skills between practices. Playing with other people, "
     "even at a simple level, keeps motivation high."),
    ("The Amazon rainforest stores huge amounts of carbon and holds a tenth of the world's known species.",
     "The Amazon basin covers about six million square kilometres across nine countries and contains the "
     "largest tropical rainforest on Earth. Its trees hold enormous amounts of carbon, and the moisture they "
     "release forms clouds that bring rain to farms far to the south. Scientists estimate that around one "
     "in ten known species lives there, and many more have never been described. Clearing for cattle "
     "pasture and soy fields has removed a large share of the forest, and researchers warn that beyond a "
     "certain point parts of it could turn into dry savanna."),
    ("Typewriters standardised the QWERTY keyboard layout, which survived into the computer age.",
     "The arrangement of letters on most keyboards was settled in the 1870s for mechanical typewriters. A "
     "popular story says the QWERTY layout was designed to slow typists down, but historians think it was "
     "chosen mainly to keep commonly paired letters apart so that the metal arms would not jam. Once "
     "typists had trained on it and schools taught it, switching became costly, and the layout moved "
     "unchanged to electric typewriters, computers and phone screens. Alternative layouts that claim to be "
     "faster have loyal fans but have never displaced it."),
    ("Mushrooms are the fruiting bodies of fungi, most of which live hidden in soil as networks of threads.",
     "The mushroom you see in a forest is only a small part of the organism that produced it. Most of a "
     "fungus lives underground as a web of thin threads called hyphae, which spread through soil and dead "
     "wood, breaking down material that few other living things can digest. Many fungi also partner with "
     "tree roots, trading minerals for sugars. When conditions are right, often after autumn rain, the "
     "network sends up mushrooms to release spores. One honey fungus in Oregon covers several square "
     "kilometres and is among the largest organisms known."),
    ("Trains in Japan are famous for their punctuality, with average delays measured in seconds.",
     "Japan's high-speed Shinkansen trains have carried billions of passengers since the first line opened "
     "in 1964, with an outstanding safety record. Their punctuality is legendary: the average delay on some "
     "lines is well under a minute, including delays caused by typhoons and earthquakes. Staff are trained "
     "to point at signals and call out checks aloud, a habit that reduces mistakes. Cleaning crews turn a "
     "train around in a few minutes at the terminal, rotating every seat to face the direction of travel "
     "before the next passengers board."),
    ("Ancient Romans built concrete structures that have lasted two thousand years.",
     "Roman engineers made concrete by mixing lime with volcanic ash, rubble and water. The recipe proved "
     "remarkably durable: harbour walls built in the sea still stand, and the unreinforced dome of the "
     "Pantheon in Rome remains the largest of its kind after nearly two thousand years. Researchers have "
     "found that small lumps of lime in the mix can react with water seeping into cracks and seal them "
     "again, a kind of self-healing. Modern concrete is stronger when new, but the steel bars inside it can "
     "rust, which limits its life."),
    ("Procrastination is often about managing unpleasant feelings rather than poor time management.",
     "People tend to describe procrastination as laziness or a failure to plan, but psychologists now see "
     "it largely as a way of escaping bad feelings. A task that seems boring, confusing or likely to expose "
     "our mistakes produces discomfort, and putting it off brings instant relief. The relief does not last, "
     "and the guilt that follows makes the task feel even worse the next time. Strategies that help include "
     "breaking the work into a very small first step, forgiving yourself for past delays and deciding in "
     "advance when and where you will start."),
    ("Cheese making turns milk into a long-lasting food through curdling, draining and ageing.",
     "Making cheese begins by warming milk and adding bacteria that turn some of its sugar into acid. Then "
     "the cheesemaker adds rennet, an enzyme that makes the milk proteins clump together into a soft curd. "
     "The curd is cut, stirred and drained of its liquid whey; the smaller the pieces and the longer the "
     "cooking, the harder the final cheese. It is pressed into moulds, salted and left to age in cool rooms "
     "for anything from a few weeks to several years. During that time, microbes and enzymes develop the "
     "flavour and texture."),
    ("Telescopes in space avoid the blurring of the atmosphere and can observe light that never reaches the ground.",
     "The air above us is constantly moving, which makes stars twinkle and blurs the images of even the "
     "largest telescopes on the ground. It also absorbs much of the infrared, ultraviolet and X-ray light "
     "coming from space. Placing a telescope in orbit solves both problems. The Hubble Space Telescope, "
     "launched in 1990, sent back sharp images of distant galaxies for more than three decades. The James "
     "Webb Space Telescope, launched in 2021, observes mainly in infrared from a point far beyond the "
     "Moon, where a large sunshield keeps its instruments extremely cold."),
    ("Community gardens give city residents space to grow food and get to know their neighbours.",
     "On a vacant lot that once collected litter, a community garden might now hold dozens of raised "
     "beds, each looked after by a different household. Members grow tomatoes, beans, herbs and flowers, "
     "share tools and water, and swap advice about pests and watering. Older gardeners teach younger ones, "
     "and children who have never seen a carrot pulled from the soil get their hands dirty. Beyond the "
     "vegetables, organisers say the real harvest is social: people who lived on the same street for years "
     "without speaking end up trading recipes over the fence."),
]

PROSE += [
    ("Bicycles became popular in the 1890s and gave ordinary people, especially women, a new freedom of movement.",
     "The safety bicycle, with two wheels of equal size and a chain driving the rear wheel, appeared in the "
     "1880s, and the invention of the air-filled tyre soon made it comfortable to ride. Within a decade, "
     "cycling clubs were forming across Europe and North America. For many working people, a bicycle was "
     "the first machine that let them travel further than they could walk. Women who took up cycling "
     "pushed for looser, more practical clothing, and the campaigner Susan B. Anthony said the bicycle had "
     "done more to emancipate women than anything else in the world."),
    ("Ants organise their colonies without a leader, using chemical trails and simple rules.",
     "A colony of ants can find the shortest route to food, build nests with ventilation and defend its "
     "territory, yet no single ant is in charge. The queen lays eggs but does not give orders. Instead, "
     "workers follow simple rules and react to chemical signals called pheromones. An ant that finds food "
     "lays a scent trail on the way home; others follow it and reinforce it, while trails to poorer sources "
     "fade. Computer scientists have borrowed the idea to solve routing problems, from delivery vans to "
     "data moving through networks."),
    ("Spices such as pepper and nutmeg were once worth more than gold and drove European voyages to Asia.",
     "In the Middle Ages, pepper, cloves, cinnamon and nutmeg reached Europe after passing through many "
     "hands, and each merchant added to the price. Nutmeg grew only on a few small islands in what is now "
     "Indonesia. The wish to reach these sources directly pushed Portuguese, Spanish, Dutch and English "
     "sailors into long and dangerous voyages. The trade brought great fortunes to some and terrible "
     "violence to the islanders. Today the same spices sit cheaply on supermarket shelves."),
    ("Crossword puzzles first appeared in a New York newspaper in 1913 and quickly became a craze.",
     "The first crossword, called a word-cross, was printed in the New York World in December 1913 by "
     "Arthur Wynne, a journalist from Liverpool. It was shaped like a diamond and had no black squares. "
     "By the 1920s, crosswords were so popular that publishers printed whole books of them and some "
     "libraries complained that readers were wearing out their dictionaries. British papers developed the "
     "cryptic crossword, where every clue is a small riddle combining a definition with wordplay."),
    ("Deserts are defined by how little rain they get, not by heat, so Antarctica is the largest desert.",
     "When people picture a desert, they usually imagine sand dunes under a burning sun. Geographers, "
     "however, define a desert by its rainfall: a place that receives less than about 250 millimetres of "
     "precipitation a year. By that measure, the largest desert on Earth is Antarctica, followed by the "
     "Arctic, and only then the Sahara. Many deserts are rocky rather than sandy, and nights can be "
     "freezing because dry air holds little heat. Plants and animals survive by storing water, staying "
     "underground by day or becoming active only after rare rains."),
    ("Barcodes let shops identify products instantly, and the first scanned item was a pack of chewing gum.",
     "The familiar pattern of black bars on packaging encodes a number that identifies the product. A "
     "scanner reads the widths of the bars and spaces with a beam of light and looks up the price in a "
     "database. The idea was patented in the 1950s, but it only took off once cheap lasers and computers "
     "arrived. In June 1974, a supermarket in Ohio scanned the first product with a universal barcode: a "
     "pack of chewing gum. Square QR codes, which hold much more information, were developed later to track "
     "car parts in Japan."),
    ("Whales evolved from land mammals, and fossils show the transition step by step.",
     "It seems strange that the largest animals in the ocean descend from creatures that walked on land, "
     "but the fossil record is remarkably clear. Around fifty million years ago, small hoofed mammals "
     "related to today's hippos began wading into shallow water to feed. Over millions of years their "
     "descendants grew longer bodies, their nostrils moved towards the top of the head and their back legs "
     "shrank. Some modern whales still carry tiny hip bones inside their bodies, a leftover from their "
     "four-legged ancestors."),
    ("Queues are a small but real part of daily life, and how they are organised changes how fair they feel.",
     "Researchers who study waiting lines have found that people care as much about fairness as about "
     "time. A single queue that feeds several counters feels fairer than separate lines, because nobody "
     "watches a neighbouring line move faster. Waiting also feels shorter when people have something to do "
     "or know how long it will take, which is why some airports put the baggage claim far from the gate and "
     "why theme parks display estimated waiting times. Uncertain waits feel longer than known ones."),
    ("The metric system was created in France in the 1790s to replace a confusing mix of local units.",
     "Before the French Revolution, France used hundreds of different units, and a measure of grain or "
     "cloth could change from one town to the next. Reformers wanted a system based on nature and on "
     "tens. They defined the metre as one ten-millionth of the distance from the North Pole to the equator, "
     "and two surveyors spent years measuring the arc between Dunkirk and Barcelona to fix it. Today the "
     "metre is defined using the speed of light, and almost every country uses the metric system."),
    ("Handwriting by hand may help students remember lecture material better than typing.",
     "Several studies have compared students who took notes on laptops with those who wrote by hand. The "
     "typists recorded more words, often copying the lecture almost word for word. The handwriters, forced "
     "to be selective because they were slower, had to summarise ideas in their own words, and in some "
     "experiments they answered conceptual questions better afterwards. The results are debated and other "
     "studies have found smaller effects, but many teachers now encourage students to think before they "
     "write, whatever tool they use."),
    ("Icebergs are mostly hidden underwater because ice is only slightly less dense than sea water.",
     "Fresh water ice is about ninety percent as dense as sea water, so an iceberg floats with roughly "
     "nine tenths of its volume below the surface. That is why sailors have long feared them: the visible "
     "part gives little idea of the size of the mass beneath. Most icebergs in the North Atlantic break off "
     "glaciers in Greenland and drift south on ocean currents. After the Titanic sank in 1912, countries "
     "set up the International Ice Patrol, which still tracks icebergs near the shipping lanes."),
    ("Pencils contain graphite mixed with clay, not lead, and the mix sets how hard or soft they are.",
     "Despite the name, a lead pencil contains no lead at all. Its core is graphite, a soft form of carbon, "
     "mixed with clay and baked. More clay makes a harder pencil that leaves a light, fine line, marked "
     "with an H; more graphite makes a softer, darker pencil marked with a B. The ordinary school pencil, "
     "HB, sits in the middle. The name comes from the sixteenth century, when a large deposit of graphite "
     "found in England was mistaken for a kind of lead."),
    ("Citizen scientists contribute real data to research by counting birds, classifying galaxies and more.",
     "Not all science happens in laboratories. Every winter, thousands of volunteers count the birds in "
     "their gardens and send the numbers to researchers, who use them to track how populations change. "
     "Online projects ask people to classify images of galaxies, transcribe old weather logs from ships or "
     "spot animals in photos taken by hidden cameras. Volunteers have discovered new planets and rare "
     "types of galaxy this way. The work gives scientists far more eyes than any university could pay "
     "for, and it gives volunteers a real stake in discovery."),
]
# ----------------------------------------------------------------------------------------------------
# Chat: handwritten user requests and assistant replies. Rendered as plain "User: ... / Assistant: ..."
# turns (optionally preceded by a "System: ..." line), not the model's chat template, so the text is
# model-agnostic.
# ----------------------------------------------------------------------------------------------------
SYSTEM_LINES = [
    "You are a helpful assistant.",
    "You are a friendly assistant who answers briefly.",
    "You are a careful assistant. If you are not sure, say so.",
    "You help people plan trips and everyday tasks.",
    "You are a patient tutor for secondary school students.",
    "Answer in plain language and avoid jargon.",
    "You are a concise technical assistant for software developers.",
    "Keep answers short unless the user asks for detail.",
]

CHAT = [
    ("Can you suggest a name for a grey cat?",
     "Sure! A few ideas: Smokey, Ash, Pebble, Earl Grey, Misty or Slate. If your cat is calm and "
     "dignified, Earl Grey is a fun choice."),
    ("How long should I boil an egg for a runny yolk?",
     "Lower the egg into water that is already boiling and cook it for about six minutes, then put it in "
     "cold water for a minute so it stops cooking. Large eggs straight from the fridge may need an extra "
     "thirty seconds."),
    ("Write a short thank-you note to a neighbour who watered my plants while I was away.",
     "Dear Mrs. Patel,\n\nThank you so much for looking after my plants while I was away. They are "
     "thriving, and the basil has never looked better! I brought back a little something from my trip "
     "as a thank you. Please let me know if I can ever return the favour.\n\nWarm wishes,\nDaniel"),
    ("What's the difference between weather and climate?",
     "Weather is what the atmosphere is doing over hours or days: today's rain, tomorrow's wind. Climate "
     "is the pattern of weather over a long period, usually thirty years or more, for a particular place. "
     "A simple way to remember it: climate is what you expect, weather is what you get."),
    ("I have chicken, rice, an onion and some frozen peas. What can I cook tonight?",
     "You could make a simple chicken fried rice:\n\n1. Cook the rice, or better, use leftover rice from "
     "yesterday.\n2. Cut the chicken into small pieces and fry it in a little oil until cooked through, "
     "then set it aside.\n3. Fry the chopped onion until soft, add the peas for two minutes.\n4. Add the "
     "rice and stir-fry on high heat, then return the chicken.\n5. Season with soy sauce, salt and pepper. "
     "If you have an egg, scramble it in the pan at the end."),
    ("Translate 'good morning' into Spanish.",
     "'Good morning' in Spanish is 'buenos días'."),
    ("My laptop is running really slowly. What should I check first?",
     "A few things to check, roughly in order:\n\n- Open the task manager (Activity Monitor on a Mac) and "
     "see whether one program is using most of the CPU or memory.\n- Check free disk space; a nearly full "
     "drive slows everything down.\n- Restart it if you haven't in a while, since updates often wait for "
     "a reboot.\n- Disable programs that start automatically when you log in.\n- Scan for malware.\n\nIf it "
     "is still slow after that, the hardware may simply be old, and adding memory can help."),
    ("Is it rude to recline my seat on a plane?",
     "It isn't against the rules, and the seat is designed to recline, but it's considerate to do it "
     "gently and not during meals. A quick glance behind you first is polite, especially if the person "
     "is tall or working on a laptop."),
    ("Explain recursion to me like I'm ten years old.",
     "Imagine you are standing in a long line and want to know your position, but you can only talk to "
     "the person in front of you. You ask them, 'What number are you?' They don't know either, so they ask "
     "the person in front of them, and so on. The person at the very front knows they are number one. "
     "They tell the person behind them, who says 'then I'm two', and the answers travel back down the line "
     "until they reach you. That's recursion: solving a problem by asking a smaller version of the same "
     "question, until you reach a question that's easy to answer."),
    ("Give me three tips for a job interview.",
     "1. Research the company so you can explain why you want to work there.\n2. Prepare two or three short "
     "stories about problems you solved, with what you did and what happened.\n3. Bring a couple of "
     "questions of your own; it shows genuine interest."),
    ("What's a good way to remember the order of the planets?",
     "A classic mnemonic is 'My Very Educated Mother Just Served Us Noodles': Mercury, Venus, Earth, Mars, "
     "Jupiter, Saturn, Uranus, Neptune. You can also make up your own sentence; silly ones tend to stick "
     "best."),
    ("Can you help me write a polite email asking my landlord to fix a leaking tap?",
     "Of course. Here is a draft:\n\nSubject: Leaking kitchen tap at Flat 4\n\nHello Mr. Green,\n\nI hope "
     "you are well. I wanted to let you know that the kitchen tap in my flat has started leaking steadily, "
     "even when it is fully closed. It is wasting water and has begun to stain the sink. Could you arrange "
     "for someone to take a look? I am usually at home after 5 pm, and I am happy to fit around the "
     "plumber's schedule.\n\nThank you for your help.\n\nBest regards,\nAmira Haddad"),
    ("Why do onions make you cry?",
     "When you cut an onion, you break its cells and release enzymes that turn certain sulfur compounds "
     "into a gas. That gas reaches your eyes and irritates them, so they make tears to wash it away. "
     "Chilling the onion first or using a very sharp knife reduces the effect."),
    ("Summarise the plot of Romeo and Juliet in two sentences.",
     "Two teenagers from feuding families in Verona fall in love and marry in secret. A chain of "
     "misunderstandings and violence leads both of them to take their own lives, which finally "
     "reconciles their families."),
    ("How many hours of sleep does a teenager need?",
     "Most health organisations recommend eight to ten hours a night for teenagers aged thirteen to "
     "eighteen."),
    ("I keep forgetting to drink water during the day. Any ideas?",
     "Some simple tricks that work for many people:\n\n- Keep a refillable bottle on your desk where you "
     "can see it.\n- Drink a glass with every meal and right after you wake up.\n- Set a few reminders on "
     "your phone.\n- Add slices of lemon or cucumber if plain water bores you.\n- Tie it to habits you "
     "already have, like taking a sip every time you send an email."),
    ("What does 'break a leg' mean?",
     "It's an English idiom used to wish someone good luck, especially before a performance. Theatre "
     "people traditionally consider it bad luck to say 'good luck' directly."),
    ("Plan a one-day walking tour of Rome for me.",
     "Here's a relaxed plan:\n\nMorning: Start early at the Colosseum (book tickets ahead), then walk "
     "through the Roman Forum and up the Palatine Hill.\n\nLunch: Head towards Monti for pizza by the "
     "slice or a plate of cacio e pepe.\n\nAfternoon: Walk to the Trevi Fountain, then on to the Pantheon "
     "and Piazza Navona. Stop for a gelato on the way.\n\nEvening: Cross the river to Trastevere for dinner "
     "in one of the small trattorias, and watch the streets fill up as the sun sets.\n\nWear comfortable "
     "shoes; you'll walk around twelve kilometres."),
    ("Is a tomato a fruit or a vegetable?",
     "Botanically, a tomato is a fruit, because it develops from the flower and contains seeds. In cooking, "
     "it's usually treated as a vegetable because of its savoury flavour."),
    ("Can you make this sentence sound more professional? 'Hey, the report is gonna be late, sorry.'",
     "Here's a more professional version: 'Hello, I wanted to let you know that the report will be "
     "slightly delayed. I apologise for the inconvenience and will send it by Thursday.'"),
    ("What are some good habits for learning a new language?",
     "A few habits that make a big difference:\n\n1. Practise a little every day rather than a lot once a "
     "week.\n2. Learn the most common words first; a thousand words cover most everyday conversation.\n3. "
     "Listen to podcasts or shows in the language, even if you understand only part.\n4. Speak from the "
     "start, even badly; a language exchange partner helps.\n5. Review vocabulary with spaced repetition "
     "so you see words again just before you would forget them."),
    ("Tell me a joke about computers.",
     "Why did the computer go to the doctor? Because it had a virus, and it wouldn't stop coughing up "
     "pop-ups."),
    ("How do I get a red wine stain out of a white shirt?",
     "Act quickly. Blot up as much as you can with a paper towel without rubbing. Rinse the back of the "
     "stain with cold water, then cover it with a paste of baking soda and water, or a little washing-up "
     "liquid mixed with hydrogen peroxide if the fabric can take it. Leave it for a few minutes and wash "
     "the shirt as usual in cold water. Check the stain before drying, because heat can set it."),
    ("Which is bigger, a kilobyte or a megabyte?",
     "A megabyte is bigger. A megabyte is about a thousand kilobytes."),
    ("I want to start running but I get out of breath after two minutes. What should I do?",
     "That's completely normal at the start. Try a walk-run plan: run for one minute, walk for two, and "
     "repeat this eight times, three days a week. Each week, make the running part a little longer and the "
     "walking part shorter. Run slowly enough that you could still talk in short sentences. After eight to "
     "ten weeks, most people can run for twenty or thirty minutes without stopping."),
    ("What is the capital of Australia?",
     "The capital of Australia is Canberra, not Sydney as many people assume."),
    ("Can you explain what a budget is and how to make one?",
     "A budget is a plan for your money: it lists what comes in and decides in advance where it goes.\n\n"
     "To make a simple one:\n1. Write down your monthly income after tax.\n2. List fixed costs such as rent, "
     "bills and transport.\n3. Look at the last two months of spending to estimate variable costs like "
     "food and going out.\n4. Decide how much to save, ideally paying yourself first on payday.\n5. Track "
     "your spending for a month and adjust.\n\nA popular rule of thumb is fifty percent for needs, thirty "
     "for wants and twenty for savings."),
    ("Write a haiku about autumn.",
     "Maple leaves let go,\nthe cold wind carries them home,\nquiet paths turn red."),
    ("What should I pack for a weekend camping trip?",
     "Here's a basic checklist:\n\n- Tent, sleeping bag and sleeping mat\n- Headlamp with spare batteries\n"
     "- Warm layers and a rain jacket, even if the forecast is good\n- Stove, fuel, a pot, a lighter and a "
     "mug\n- Easy food: pasta, oats, nuts, dried fruit\n- Water bottle and a way to treat water\n- First "
     "aid kit, sun cream and insect repellent\n- A bag to carry your rubbish out\n\nCheck whether fires are "
     "allowed at the site before you go."),
    ("How do I say no to extra work without upsetting my boss?",
     "Be positive about the work and honest about your capacity. For example: 'I'd like to help with "
     "this. Right now I'm focused on the client report due Friday. If I take this on, which of these should "
     "I move?' That way you're not refusing, you're asking your boss to choose priorities, which is their "
     "job anyway."),
    ("Why is the sea salty?",
     "Rain slowly dissolves minerals from rocks on land, and rivers carry them to the sea. When sea water "
     "evaporates, the water leaves but the salts stay behind, so over millions of years they have built "
     "up. Hot springs on the ocean floor add more minerals too."),
    ("Recommend a board game for four adults who like strategy.",
     "Try Ticket to Ride for something easy to learn, or Terraforming Mars if your group likes deeper "
     "strategy and doesn't mind a game lasting two hours. Catan is also a classic for four players."),
    ("What time zone is London in?",
     "London uses Greenwich Mean Time (GMT, UTC+0) in winter and British Summer Time (BST, UTC+1) in "
     "summer."),
    ("Help me understand what inflation is.",
     "Inflation is the general rise in prices over time, which means each unit of money buys a little "
     "less than before. If inflation is three percent a year, a basket of shopping that costs one hundred "
     "pounds today will cost about one hundred and three pounds next year. Moderate inflation is normal in "
     "a growing economy; central banks usually aim for around two percent. High inflation hurts people on "
     "fixed incomes and savers, because their money loses value quickly."),
    ("My friend is sad because her dog died. What can I say to her?",
     "Keep it simple and sincere. You might say: 'I'm so sorry about Biscuit. He was such a lovely dog, and "
     "I know how much you loved him.' Sharing a small memory of the dog can mean a lot. You don't need to "
     "fix her feelings; offering to bring food or go for a walk together shows you care."),
    ("Convert 5 kilometres to miles.",
     "5 kilometres is about 3.1 miles."),
    ("What's the best way to store fresh herbs?",
     "Treat soft herbs such as parsley, coriander and basil like flowers: trim the stems and stand them in "
     "a glass of water. Keep basil at room temperature, and cover the others loosely with a bag in the "
     "fridge. Woody herbs like rosemary and thyme keep best wrapped in a slightly damp paper towel in the "
     "fridge."),
    ("Can you check my grammar? 'Me and him goes to the library every tuesdays.'",
     "Here's the corrected sentence: 'He and I go to the library every Tuesday.' Use 'He and I' as the "
     "subject, 'go' to agree with a plural subject, and 'Tuesday' in the singular with a capital letter."),
    ("What's a healthy breakfast I can make in five minutes?",
     "Greek yoghurt with a handful of berries, a spoonful of oats and a few nuts takes two minutes and "
     "keeps you full. Another option is wholemeal toast with peanut butter and a sliced banana."),
    ("I have to give a five-minute talk at a wedding. How should I structure it?",
     "A simple structure that works well:\n\n1. Introduce yourself and how you know the couple (thirty "
     "seconds).\n2. Tell one or two short, warm stories about the person you know best, funny but never "
     "embarrassing.\n3. Say something about them as a couple: what you noticed when they met, what they "
     "bring out in each other.\n4. End with a wish for their future and invite everyone to raise a "
     "glass.\n\nWrite it out, practise it aloud, and time it. Five minutes is about 650 words."),
    ("What's the difference between 'affect' and 'effect'?",
     "Usually 'affect' is a verb meaning to influence ('the rain affected the match'), and 'effect' is a "
     "noun meaning a result ('the rain had a big effect'). A quick trick: Affect is an Action, Effect is an "
     "End result."),
    ("How often should I water a cactus?",
     "Less than you think. In spring and summer, water it thoroughly every two to three weeks and let the "
     "soil dry out completely between waterings. In winter, once a month or even less is enough."),
    ("Could you outline a weekly workout plan for a beginner?",
     "Here's a gentle plan for someone starting out:\n\nMonday: 30-minute brisk walk.\nTuesday: Body-weight "
     "strength: squats, push-ups against a wall, lunges and a plank, two rounds.\nWednesday: Rest or easy "
     "stretching.\nThursday: 30-minute walk or bike ride.\nFriday: Strength again, three rounds if Tuesday "
     "felt fine.\nSaturday: Something fun: swimming, dancing, a hike.\nSunday: Rest.\n\nIncrease slowly, "
     "and stop any exercise that causes sharp pain."),
    ("What is the boiling point of water in Fahrenheit?",
     "Water boils at 212 degrees Fahrenheit at sea level."),
]

CHAT += [
    ("How do I politely end a phone call that's going on too long?",
     "Signal the end before you say goodbye, so it doesn't feel abrupt. For example: 'It's been great "
     "catching up. I need to start on dinner soon, so I'll let you go. Let's talk again next week.' "
     "Summarising the next step, like a plan to meet, helps the other person feel the call ended "
     "naturally."),
    ("What's the difference between a virus and a bacterium?",
     "Bacteria are single-celled living organisms that can reproduce on their own; many are harmless or "
     "even helpful, and bacterial infections can often be treated with antibiotics. Viruses are much "
     "smaller and cannot reproduce without getting inside a host cell. Antibiotics do nothing against "
     "viruses, which is why they don't help with a cold or the flu."),
    ("Give me a simple recipe for tomato soup.",
     "Here's an easy one for four people:\n\n1. Soften a chopped onion and two cloves of garlic in olive "
     "oil for five minutes.\n2. Add two tins of chopped tomatoes, 500 ml of vegetable stock and a pinch of "
     "sugar.\n3. Simmer for twenty minutes.\n4. Blend until smooth and season with salt and pepper.\n5. "
     "Stir in a splash of cream or a few basil leaves before serving.\n\nIt goes well with toasted cheese "
     "sandwiches."),
    ("Why do we have leap years?",
     "The Earth takes about 365.24 days to go around the Sun. If every year had 365 days, the calendar "
     "would drift by about a day every four years, and over centuries the seasons would shift. Adding "
     "29 February every four years fixes most of the gap. Years divisible by 100 are skipped unless they "
     "are also divisible by 400, which is why 2000 was a leap year but 1900 was not."),
    ("Can you suggest a few names for a small bakery?",
     "Here are some ideas:\n\n- The Rising Loaf\n- Crumb & Co.\n- Morning Oven\n- Flour Child\n- The Corner "
     "Crust\n\nIf the bakery is known for one thing, such as sourdough or cinnamon rolls, putting it in the "
     "name can help people remember you."),
    ("I'm nervous about flying. Any tips?",
     "That's very common. Some things that help many people:\n\n- Learn a little about how planes work; "
     "turbulence is uncomfortable but normal and planes are built for it.\n- Choose a seat over the wing, "
     "where the ride is smoothest.\n- Breathe slowly: in for four counts, out for six.\n- Bring something "
     "absorbing, such as a film, a puzzle book or a podcast.\n- Tell the cabin crew; they are used to "
     "nervous flyers and will check on you.\n\nIf the fear is strong, short courses for fearful flyers "
     "have good results."),
    ("What does HTTP stand for?",
     "HTTP stands for HyperText Transfer Protocol, the set of rules browsers and web servers use to "
     "exchange pages and data."),
    ("Explain what a mortgage is in simple terms.",
     "A mortgage is a loan used to buy a home. The bank pays most of the price, and you pay the money back "
     "in monthly instalments over many years, usually with interest. The home itself serves as security: "
     "if the payments stop, the lender can take the property to recover the money."),
    ("My tomato plants have yellow leaves at the bottom. Is that bad?",
     "A few yellow leaves at the bottom are often normal, because older leaves get shaded and the plant "
     "lets them go. If the yellowing spreads upward, common causes are overwatering, a lack of nitrogen, "
     "or a fungal disease, especially if the leaves have brown spots. Remove the affected leaves, water at "
     "the base rather than over the foliage, and feed the plants with a tomato fertiliser."),
    ("Write a two-line birthday message for my grandmother.",
     "Happy birthday, Grandma! Thank you for all the stories, the hugs and the best apple cake in the "
     "world. I love you very much."),
    ("How many players are there in a football team?",
     "A football (soccer) team has eleven players on the pitch, including the goalkeeper."),
    ("What is the best way to learn to touch type?",
     "Start with the home row: rest your fingers on A S D F and J K L ;, and learn which finger presses "
     "each key. Use a free typing tutor for fifteen minutes a day, and resist looking at the keyboard, "
     "even if you feel slow at first. Accuracy comes before speed; most people reach their old speed within "
     "a few weeks and then overtake it."),
    ("Can you explain what a 'carbon footprint' means?",
     "A carbon footprint is the total amount of greenhouse gases caused by a person, product or "
     "organisation, usually expressed as tonnes of carbon dioxide equivalent per year. It includes direct "
     "emissions, such as burning petrol in a car, and indirect ones, such as the energy used to make the "
     "food and goods you buy."),
    ("How do I make my cover letter stand out?",
     "Open with a specific reason you want this job at this company, not a generic sentence. Pick two "
     "achievements that match the job description and describe them with concrete results. Keep it under "
     "one page, address it to a named person if you can, and end by saying you'd welcome the chance to "
     "discuss how you could help the team."),
    ("Is it safe to eat raw cookie dough?",
     "It's best to avoid it. Raw flour can carry bacteria such as E. coli, and raw eggs can carry "
     "Salmonella. Some shops sell cookie dough made with heat-treated flour and no eggs, which is meant to "
     "be eaten raw."),
    ("What are three interesting facts about the Moon?",
     "1. The Moon always shows the same face to Earth, because it spins once for every orbit.\n2. It is "
     "slowly moving away from us, by about 3.8 centimetres a year.\n3. Twelve people have walked on it, "
     "all between 1969 and 1972."),
]
SYSTEM_LINES += ["You are a cheerful assistant for a cooking website.", "Reply as a knowledgeable librarian would."]
# ----------------------------------------------------------------------------------------------------
# Code: handwritten functions in several languages. A sample is one or more snippets of one language,
# joined like a source file.
# ----------------------------------------------------------------------------------------------------
CODE = [
    ("python", '''def is_palindrome(text: str) -> bool:
    """Return True if text reads the same backwards, ignoring case and spaces."""
    cleaned = "".join(ch.lower() for ch in text if ch.isalnum())
    return cleaned == cleaned[::-1]'''),
    ("python", '''def chunked(items, size):
    """Yield successive lists of at most `size` items."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch'''),
    ("python", '''import csv
from collections import defaultdict


def total_by_category(path):
    """Sum the 'amount' column of a CSV file per 'category'."""
    totals = defaultdict(float)
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            totals[row["category"]] += float(row["amount"])
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))'''),
    ("python", '''class LRUCache:
    """A tiny least-recently-used cache built on an ordered dict."""

    def __init__(self, capacity: int):
        from collections import OrderedDict
        self.capacity = capacity
        self._data = OrderedDict()

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)'''),
    ("python", '''def binary_search(values, target):
    lo, hi = 0, len(values) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if values[mid] == target:
            return mid
        if values[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1'''),
    ("python", '''squares = [n * n for n in range(10) if n % 2 == 0]
print(squares)  # [0, 4, 16, 36, 64]'''),
    ("python", '''from dataclasses import dataclass
from datetime import date


@dataclass
class Invoice:
    number: str
    customer: str
    issued: date
    lines: list

    def total(self) -> float:
        return round(sum(qty * price for qty, price in self.lines), 2)

    def is_overdue(self, today: date, days: int = 30) -> bool:
        return (today - self.issued).days > days'''),
    ("python", '''import re

EMAIL = re.compile(r"^[\\w.+-]+@[\\w-]+\\.[\\w.-]+$")


def valid_emails(candidates):
    """Keep the strings that look like e-mail addresses."""
    return [c.strip() for c in candidates if EMAIL.match(c.strip())]'''),
    ("python", '''def word_frequencies(text, top=10):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?\\"'()")
        if word:
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:top]'''),
    ("python", '''import json
from pathlib import Path


def load_settings(path: Path) -> dict:
    """Read JSON settings, falling back to defaults for missing keys."""
    defaults = {"theme": "light", "autosave": True, "font_size": 12}
    if not path.exists():
        return defaults
    with path.open(encoding="utf-8") as handle:
        user = json.load(handle)
    return {**defaults, **user}'''),
    ("javascript", '''function debounce(fn, waitMs) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), waitMs);
  };
}'''),
    ("javascript", '''async function fetchJson(url, retries = 3) {
  for (let attempt = 1; attempt <= retries; attempt++) {
    try {
      const response = await fetch(url);
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      return await response.json();
    } catch (err) {
      if (attempt === retries) throw err;
      await new Promise((r) => setTimeout(r, 200 * attempt));
    }
  }
}'''),
    ("javascript", '''const groupBy = (items, keyFn) =>
  items.reduce((acc, item) => {
    const key = keyFn(item);
    (acc[key] ||= []).push(item);
    return acc;
  }, {});'''),
    ("javascript", '''class TodoList {
  constructor() {
    this.items = [];
    this.nextId = 1;
  }

  add(title) {
    const item = { id: this.nextId++, title, done: false };
    this.items.push(item);
    return item;
  }

  toggle(id) {
    const item = this.items.find((t) => t.id === id);
    if (item) item.done = !item.done;
  }

  remaining() {
    return this.items.filter((t) => !t.done).length;
  }
}'''),
    ("typescript", '''interface User {
  id: number;
  name: string;
  email?: string;
}

export function displayName(user: User): string {
  return user.email ? `${user.name} <${user.email}>` : user.name;
}'''),
    ("rust", '''fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = b;
        b = a % b;
        a = t;
    }
    a
}'''),
    ("rust", '''use std::collections::HashMap;

pub fn count_words(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        let word = word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
        if !word.is_empty() {
            *counts.entry(word).or_insert(0) += 1;
        }
    }
    counts
}'''),
    ("rust", '''#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Circle { radius: f64 },
    Rectangle { width: f64, height: f64 },
}

impl Shape {
    pub fn area(&self) -> f64 {
        match self {
            Shape::Circle { radius } => std::f64::consts::PI * radius * radius,
            Shape::Rectangle { width, height } => width * height,
        }
    }
}'''),
    ("go", '''package stats

// Mean returns the arithmetic mean of xs, or 0 for an empty slice.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}'''),
    ("go", '''func worker(id int, jobs <-chan string, results chan<- int) {
	for url := range jobs {
		resp, err := http.Get(url)
		if err != nil {
			log.Printf("worker %d: %v", id, err)
			results <- -1
			continue
		}
		results <- resp.StatusCode
		resp.Body.Close()
	}
}'''),
    ("go", '''type Stack[T any] struct {
	items []T
}

func (s *Stack[T]) Push(v T) { s.items = append(s.items, v) }

func (s *Stack[T]) Pop() (T, bool) {
	var zero T
	if len(s.items) == 0 {
		return zero, false
	}
	v := s.items[len(s.items)-1]
	s.items = s.items[:len(s.items)-1]
	return v, true
}'''),
    ("c", '''#include <stdio.h>

/* Reverse a string in place. */
void reverse(char *s) {
    size_t n = 0;
    while (s[n] != '\\0') n++;
    for (size_t i = 0; i < n / 2; i++) {
        char tmp = s[i];
        s[i] = s[n - 1 - i];
        s[n - 1 - i] = tmp;
    }
}'''),
    ("c", '''int count_lines(FILE *fp) {
    int c, lines = 0;
    while ((c = fgetc(fp)) != EOF) {
        if (c == '\\n') lines++;
    }
    return lines;
}'''),
    ("sql", '''SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS revenue
FROM customers AS c
JOIN orders AS o ON o.customer_id = c.id
WHERE o.created_at >= DATE '2024-01-01'
GROUP BY c.name
HAVING COUNT(o.id) > 3
ORDER BY revenue DESC
LIMIT 20;'''),
    ("sql", '''CREATE TABLE books (
    id          INTEGER PRIMARY KEY,
    title       TEXT NOT NULL,
    author      TEXT NOT NULL,
    published   INTEGER CHECK (published > 1400),
    isbn        TEXT UNIQUE
);

CREATE INDEX idx_books_author ON books (author);'''),
    ("bash", '''#!/usr/bin/env bash
set -euo pipefail

# Compress every log file older than seven days.
find /var/log/myapp -name "*.log" -mtime +7 -print0 |
  while IFS= read -r -d '' file; do
    gzip "$file"
    echo "compressed $file"
  done'''),
    ("bash", '''for f in *.jpg; do
  mv -- "$f" "${f%.jpg}.jpeg"
done'''),
    ("java", '''public final class Temperature {
    private final double celsius;

    public Temperature(double celsius) {
        if (celsius < -273.15) {
            throw new IllegalArgumentException("below absolute zero: " + celsius);
        }
        this.celsius = celsius;
    }

    public double toFahrenheit() {
        return celsius * 9.0 / 5.0 + 32.0;
    }
}'''),
    ("java", '''List<String> names = people.stream()
    .filter(p -> p.getAge() >= 18)
    .map(Person::getName)
    .sorted()
    .collect(Collectors.toList());'''),
    ("python", '''def fizzbuzz(n):
    for i in range(1, n + 1):
        if i % 15 == 0:
            print("FizzBuzz")
        elif i % 3 == 0:
            print("Fizz")
        elif i % 5 == 0:
            print("Buzz")
        else:
            print(i)'''),
    ("python", '''import sqlite3


def top_products(db_path, limit=5):
    """Return the best-selling products as (name, units) pairs."""
    query = """
        SELECT p.name, SUM(s.quantity) AS units
        FROM sales s JOIN products p ON p.id = s.product_id
        GROUP BY p.name ORDER BY units DESC LIMIT ?
    """
    with sqlite3.connect(db_path) as conn:
        return conn.execute(query, (limit,)).fetchall()'''),
    ("python", '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged'''),
    ("python", '''from functools import lru_cache


@lru_cache(maxsize=None)
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)'''),
    ("javascript", '''document.querySelector("#signup").addEventListener("submit", (event) => {
  const email = event.target.elements.email.value.trim();
  if (!email.includes("@")) {
    event.preventDefault();
    showError("Please enter a valid email address.");
  }
});'''),
    ("rust", '''fn parse_pair(s: &str, sep: char) -> Option<(i32, i32)> {
    let (a, b) = s.split_once(sep)?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}'''),
    ("go", '''func ReadLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var lines []string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	return lines, scanner.Err()
}'''),
    ("c", '''typedef struct Node {
    int value;
    struct Node *next;
} Node;

Node *push_front(Node *head, int value) {
    Node *node = malloc(sizeof *node);
    if (!node) return head;
    node->value = value;
    node->next = head;
    return node;
}'''),
    ("sql", '''UPDATE accounts
SET balance = balance - 50.00
WHERE id = 17 AND balance >= 50.00;'''),
    ("python", '''import time
from contextlib import contextmanager


@contextmanager
def timer(label):
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        print(f"{label}: {elapsed * 1000:.1f} ms")'''),
    ("python", '''def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32'''),
    ("javascript", '''export function formatPrice(cents, currency = "EUR") {
  return new Intl.NumberFormat("en-GB", { style: "currency", currency }).format(cents / 100);
}'''),
    ("bash", '''du -sh ./* | sort -h | tail -n 5'''),
    ("python", '''class BankAccount:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount'''),
]

# A short line of context that introduces a file, per language (keeps samples looking like real files).
CODE_HEADERS = {
    "python": ["# utils.py", "# helpers for the reporting job", "# -*- coding: utf-8 -*-", "# small examples"],
    "javascript": ["// utils.js", "// front-end helpers", "'use strict';", "// shared functions"],
    "typescript": ["// types.ts", "// user helpers"],
    "rust": ["// lib.rs", "//! Small utility functions."],
    "go": ["// Package util has small helpers.", "// util.go"],
    "c": ["/* util.c */", "#include <stdlib.h>"],
    "sql": ["-- reporting queries", "-- schema.sql"],
    "bash": ["# maintenance script", "# run from the project root"],
    "java": ["// Temperature.java", "// domain classes"],
}

CODE += [
    ("python", '''def flatten(nested):
    """Flatten arbitrarily nested lists into one list."""
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out'''),
    ("python", '''import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Resize images in a folder.")
    parser.add_argument("folder", help="folder with the images")
    parser.add_argument("--width", type=int, default=800, help="target width in pixels")
    parser.add_argument("--dry-run", action="store_true", help="only print what would change")
    return parser.parse_args(argv)'''),
    ("javascript", '''function slugify(title) {
  return title
    .toLowerCase()
    .normalize("NFD")
    .replace(/[\\u0300-\\u036f]/g, "")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "");
}'''),
    ("rust", '''pub fn median(values: &mut Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mid = values.len() / 2;
    if values.len() % 2 == 0 {
        Some((values[mid - 1] + values[mid]) / 2.0)
    } else {
        Some(values[mid])
    }
}'''),
    ("go", '''func Reverse(s string) string {
	runes := []rune(s)
	for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
		runes[i], runes[j] = runes[j], runes[i]
	}
	return string(runes)
}'''),
    ("sql", '''SELECT department, ROUND(AVG(salary), 0) AS avg_salary
FROM employees
GROUP BY department
ORDER BY avg_salary DESC;'''),
    ("c", '''double average(const int *values, size_t n) {
    if (n == 0) return 0.0;
    long sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += values[i];
    }
    return (double)sum / n;
}'''),
    ("java", '''public static boolean isLeapYear(int year) {
    return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}'''),
    ("typescript", '''type Result<T> = { ok: true; value: T } | { ok: false; error: string };

export function parseAge(input: string): Result<number> {
  const n = Number.parseInt(input, 10);
  if (Number.isNaN(n) || n < 0 || n > 150) {
    return { ok: false, error: `not a valid age: ${input}` };
  }
  return { ok: true, value: n };
}'''),
    ("bash", '''#!/usr/bin/env bash
# Back up the notes folder with today's date in the archive name.
stamp=$(date +%Y-%m-%d)
tar -czf "notes-$stamp.tar.gz" notes/
echo "saved notes-$stamp.tar.gz"'''),
    ("python", '''from collections import Counter


def most_common_letter(text):
    letters = [c for c in text.lower() if c.isalpha()]
    if not letters:
        return None
    return Counter(letters).most_common(1)[0][0]'''),
    ("javascript", '''const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));'''),
]
# ----------------------------------------------------------------------------------------------------
# Math: worked word problems. Each template is handwritten (story + solution steps); numbers and names
# are drawn by the seeded generator, and every answer is computed, so the arithmetic is always right.
# ----------------------------------------------------------------------------------------------------
NAMES = ["Amara", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi",
         "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tara", "Uma", "Victor"]


def _m_apples(r):
    n, a, b = r.choice(NAMES), r.randint(12, 60), r.randint(2, 9)
    c = r.randint(1, a - 1)
    return (f"Problem: {n} picks {a} apples and gives {c} of them to a neighbour. Then {n} buys {b} more "
            f"bags with 6 apples in each. How many apples does {n} have now?\n"
            f"Solution: After giving some away, {n} has {a} - {c} = {a - c} apples. The bags hold "
            f"{b} x 6 = {b * 6} apples. In total {a - c} + {b * 6} = {a - c + b * 6}.\n"
            f"Answer: {a - c + b * 6}")


def _m_speed(r):
    v, t = r.choice([40, 45, 50, 60, 72, 80, 90]), r.choice([1.5, 2, 2.5, 3, 4])
    d = v * t
    return (f"A train travels at a steady {v} km/h for {t:g} hours. How far does it go?\n"
            f"Distance equals speed times time, so the train covers {v} x {t:g} = {d:g} km.\n"
            f"The answer is {d:g} km.")


def _m_percent(r):
    price, pct = r.choice([20, 35, 48, 60, 80, 120, 150, 250]), r.choice([10, 15, 20, 25, 30, 40])
    off = price * pct / 100
    return (f"Question: A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price?\n"
            f"Work: {pct}% of {price} is {price} x {pct}/100 = {off:g}. Subtract it from the original price: "
            f"{price} - {off:g} = {price - off:g}.\n"
            f"So the jacket costs ${price - off:.2f}.")


def _m_rectangle(r):
    w, h = r.randint(3, 25), r.randint(3, 25)
    return (f"A rectangular garden is {w} metres long and {h} metres wide. Find its area and the length of "
            f"fence needed to go around it.\n"
            f"Area = length x width = {w} x {h} = {w * h} square metres.\n"
            f"Perimeter = 2 x (length + width) = 2 x ({w} + {h}) = {2 * (w + h)} metres.\n"
            f"The garden covers {w * h} m^2 and needs {2 * (w + h)} m of fence.")


def _m_average(r):
    k = r.randint(4, 6)
    xs = [r.randint(50, 100) for _ in range(k)]
    s = sum(xs)
    n = r.choice(NAMES)
    return (f"{n}'s test scores this term were {', '.join(map(str, xs))}. What is the mean score?\n"
            f"Add the scores: {' + '.join(map(str, xs))} = {s}. There are {k} tests, so the mean is "
            f"{s} / {k} = {s / k:.2f}.\n"
            f"Answer: about {s / k:.1f}")


def _m_linear(r):
    a, x, b = r.randint(2, 9), r.randint(-10, 15), r.randint(-20, 20)
    c = a * x + b
    sign = "+" if b >= 0 else "-"
    return (f"Solve for x: {a}x {sign} {abs(b)} = {c}.\n"
            f"Step 1: move the constant to the right-hand side: {a}x = {c} {'-' if b >= 0 else '+'} {abs(b)} "
            f"= {c - b}.\n"
            f"Step 2: divide both sides by {a}: x = {c - b} / {a} = {x}.\n"
            f"Check: {a} x {x} {sign} {abs(b)} = {c}. Correct, so x = {x}.")


def _m_recipe(r):
    base, want = r.choice([2, 4, 6]), r.choice([3, 5, 8, 9, 10, 12])
    flour = r.choice([150, 200, 240, 300])
    eggs = r.choice([1, 2, 3])
    f2 = flour * want / base
    e2 = eggs * want / base
    return (f"A pancake recipe for {base} people uses {flour} g of flour and {eggs} egg{'s' if eggs > 1 else ''}. "
            f"How much of each is needed for {want} people?\n"
            f"The scale factor is {want} / {base} = {want / base:.3g}. Flour: {flour} x {want / base:.3g} = "
            f"{f2:g} g. Eggs: {eggs} x {want / base:.3g} = {e2:g}, so in practice "
            f"{round(e2 + 0.49)} eggs.\n")


def _m_ages(r):
    a, d = r.randint(6, 15), r.randint(20, 35)
    n1, n2 = r.sample(NAMES, 2)
    y = r.randint(2, 10)
    return (f"{n2} is {d} years older than {n1}. In {y} years, the sum of their ages will be "
            f"{2 * a + d + 2 * y}. How old is {n1} now?\n"
            f"Let {n1}'s age be a. Then {n2} is a + {d}. In {y} years their ages add to "
            f"(a + {y}) + (a + {d} + {y}) = 2a + {d + 2 * y}.\n"
            f"So 2a + {d + 2 * y} = {2 * a + d + 2 * y}, which gives 2a = {2 * a} and a = {a}.\n"
            f"{n1} is {a} years old now and {n2} is {a + d}.")


def _m_fraction(r):
    from fractions import Fraction
    a, b = Fraction(r.randint(1, 5), r.choice([2, 3, 4, 6, 8])), Fraction(r.randint(1, 5), r.choice([3, 4, 5, 10]))
    return (f"Compute {a} + {b} and give the result as a fraction in lowest terms.\n"
            f"Use a common denominator of {a.denominator * b.denominator // __import__('math').gcd(a.denominator, b.denominator)}. "
            f"The sum is {a + b}.\n"
            f"Result: {a + b}")


def _m_shop(r):
    n = r.choice(NAMES)
    items = r.sample([("notebooks", 3), ("pens", 1), ("folders", 2), ("rulers", 2), ("erasers", 1),
                      ("markers", 4), ("calculators", 12)], 3)
    qty = [r.randint(1, 6) for _ in items]
    lines = [f"{q} {name} at ${p} each" for (name, p), q in zip(items, qty)]
    costs = [q * p for (_, p), q in zip(items, qty)]
    paid = ((sum(costs) // 10) + 1) * 10
    return (f"{n} buys {', '.join(lines[:-1])} and {lines[-1]}. {n} pays with ${paid}. How much change is due?\n"
            + "".join(f"- {q} x ${p} = ${c}\n" for (_, p), q, c in zip(items, qty, costs))
            + f"Total: ${sum(costs)}. Change: {paid} - {sum(costs)} = ${paid - sum(costs)}.")


def _m_work(r):
    a, b = r.choice([(3, 6), (4, 12), (6, 12), (10, 15), (12, 24), (5, 20)])
    t = a * b / (a + b)
    return (f"One pipe fills a tank in {a} hours and a second pipe fills it in {b} hours. How long do they take "
            f"together?\n"
            f"Per hour the first fills 1/{a} of the tank and the second fills 1/{b}. Together they fill "
            f"1/{a} + 1/{b} = {a + b}/{a * b} of the tank per hour, so the time is {a * b}/{a + b} = {t:g} hours.")


def _m_sequence(r):
    a, d, k = r.randint(1, 9), r.randint(2, 7), r.randint(8, 20)
    last = a + (k - 1) * d
    return (f"The sequence {a}, {a + d}, {a + 2 * d}, {a + 3 * d}, ... goes up by the same amount each time. "
            f"What is term number {k}, and what is the sum of the first {k} terms?\n"
            f"The common difference is {d}. Term {k} is {a} + ({k} - 1) x {d} = {last}.\n"
            f"The sum of an arithmetic sequence is the number of terms times the average of the first and last "
            f"term: {k} x ({a} + {last}) / 2 = {k * (a + last) // 2}.")


def _m_probability(r):
    red, blue, green = r.randint(2, 9), r.randint(2, 9), r.randint(1, 6)
    from fractions import Fraction
    p = Fraction(red, red + blue + green)
    return (f"A bag holds {red} red, {blue} blue and {green} green marble{'s' if green > 1 else ''}. One marble is drawn at random. "
            f"What is the probability that it is red?\n"
            f"There are {red + blue + green} marbles in total and {red} of them are red, so the probability is "
            f"{red}/{red + blue + green}" + (f", which simplifies to {p}." if p.denominator != red + blue + green else ".")
            + f" As a decimal that is about {float(p):.3f}.")


def _m_time(r):
    h, m = r.randint(6, 20), r.choice([0, 10, 15, 25, 30, 45, 50])
    dur = r.choice([35, 50, 75, 95, 130, 165])
    end = h * 60 + m + dur
    return (f"A film starts at {h:02d}:{m:02d} and lasts {dur} minutes. When does it end?\n"
            f"{dur} minutes is {dur // 60} hour{'s' if dur // 60 != 1 else ''} and {dur % 60} minutes. "
            f"Adding this to {h:02d}:{m:02d} gives {end // 60 % 24:02d}:{end % 60:02d}.")


def _m_units(r):
    km = r.choice([3, 5, 8, 10, 21.1, 42.2])
    return (f"How many metres are in {km:g} kilometres, and roughly how many miles is that?\n"
            f"One kilometre is 1000 metres, so {km:g} km = {km * 1000:g} m. One mile is about 1.609 km, so the "
            f"distance is about {km / 1.609:.2f} miles.")


def _m_pythagoras(r):
    a, b, c = r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (6, 8, 10), (7, 24, 25), (9, 12, 15)])
    return (f"A ladder leans against a wall. Its foot is {a} m from the wall and it reaches {b} m up the wall. "
            f"How long is the ladder?\n"
            f"The wall, the ground and the ladder form a right triangle, so by Pythagoras' theorem the length is "
            f"sqrt({a}^2 + {b}^2) = sqrt({a * a} + {b * b}) = sqrt({c * c}) = {c} m.")


# Handwritten reasoning passages (no template numbers): short explanations and proofs.
MATH_NOTES = [
    "Why is the sum of two odd numbers always even? An odd number can be written as 2m + 1 for some whole "
    "number m. Take two of them, 2m + 1 and 2n + 1. Their sum is 2m + 2n + 2 = 2(m + n + 1), which is two "
    "times a whole number, so it is even.",
    "There are infinitely many prime numbers. Suppose there were only finitely many, p1, p2, ..., pk. "
    "Multiply them all together and add one. The new number leaves a remainder of 1 when divided by each "
    "of the primes, so none of them divides it. Either it is prime itself or it has a prime factor that is "
    "not on the list. Both cases contradict the assumption, so the list of primes never ends.",
    "To check whether a number is divisible by 3, add up its digits. If the digit sum is divisible by 3, so "
    "is the number. For example, 4,281 has digit sum 4 + 2 + 8 + 1 = 15, and 15 is divisible by 3, so "
    "4,281 = 3 x 1,427. The rule works because 10 leaves a remainder of 1 when divided by 3.",
    "The angles of a triangle add up to 180 degrees. Draw a line through one corner parallel to the "
    "opposite side. The two angles this line makes with the other sides are equal to the two base angles "
    "(alternate angles), and together with the angle at the corner they form a straight line, which "
    "measures 180 degrees.",
    "When you multiply two negative numbers, the result is positive. One way to see it: 3 x (-2) = -6, "
    "2 x (-2) = -4, 1 x (-2) = -2, 0 x (-2) = 0. Each time the first factor drops by one, the product goes up "
    "by 2. Continuing the pattern, (-1) x (-2) = 2 and (-2) x (-2) = 4.",
    "Estimating before calculating catches many mistakes. If you need 48 x 21, round to 50 x 20 = 1,000. "
    "The exact product is 1,008, close to the estimate. If your calculation had given 10,080 or 108, the "
    "estimate would tell you at once that a digit slipped.",
    "The area of a circle is pi times the radius squared. Imagine cutting a circle into many thin slices "
    "like a pizza and laying them side by side, alternating point up and point down. The shape is almost a "
    "rectangle whose height is the radius r and whose width is half the circumference, pi r. Its area is "
    "therefore pi r times r.",
    "A percentage increase followed by the same percentage decrease does not bring you back to the start. "
    "If a price of 100 rises by 20%, it becomes 120. A 20% decrease then removes 24, leaving 96. The "
    "decrease is taken from a larger amount, so it removes more than the increase added.",
    "Probability of at least one: to find the chance of getting at least one six in four rolls of a die, "
    "it is easier to compute the chance of no sixes at all. Each roll misses with probability 5/6, so four "
    "misses happen with probability (5/6)^4 = 625/1296, about 0.482. The chance of at least one six is "
    "1 - 0.482 = 0.518.",
    "The square root of 2 is irrational. Suppose sqrt(2) = p/q with p and q whole numbers sharing no "
    "common factor. Then p^2 = 2q^2, so p^2 is even and p must be even, say p = 2k. Substituting gives "
    "4k^2 = 2q^2, so q^2 = 2k^2 and q is even too. Both being even contradicts the assumption that they "
    "share no factor.",
    "Order of operations: in 8 - 2 x 3, multiplication comes before subtraction, so the answer is "
    "8 - 6 = 2, not 6 x 3 = 18. Brackets change the order: (8 - 2) x 3 = 18.",
    "The mean and the median can tell different stories. In a small office where four people earn 30,000 "
    "a year and the owner earns 250,000, the mean salary is 74,000 but the median is 30,000. The median is "
    "less affected by one very large value, which is why reports on incomes often use it.",
]

MATH_TEMPLATES = [_m_apples, _m_speed, _m_percent, _m_rectangle, _m_average, _m_linear, _m_recipe, _m_ages,
                  _m_fraction, _m_shop, _m_work, _m_sequence, _m_probability, _m_time, _m_units, _m_pythagoras]

def _m_savings(r):
    n, weekly, weeks, goal = r.choice(NAMES), r.choice([5, 8, 10, 12, 15, 20]), r.randint(4, 16), r.choice([150, 200, 250, 300])
    saved = weekly * weeks
    left = max(goal - saved, 0)
    more = -(-left // weekly)
    return (f"{n} saves ${weekly} every week. After {weeks} weeks, how much has {n} saved, and how many more "
            f"weeks are needed to reach ${goal}?\n"
            f"Saved so far: {weekly} x {weeks} = ${saved}. "
            + (f"Still missing: {goal} - {saved} = ${left}, which takes {left} / {weekly} rounded up = {more} "
               f"more week{'s' if more != 1 else ''}." if left else f"That already reaches the goal of ${goal}."))


def _m_ratio(r):
    a, b = r.choice([(2, 3), (3, 5), (1, 4), (4, 5), (3, 7)])
    k = r.randint(3, 12)
    total = (a + b) * k
    return (f"Red and white paint are mixed in the ratio {a}:{b}. How much of each is in {total} litres of the mix?\n"
            f"The ratio has {a} + {b} = {a + b} parts, so one part is {total} / {a + b} = {k} litres. "
            f"Red: {a} x {k} = {a * k} litres; white: {b} x {k} = {b * k} litres.")


def _m_interest(r):
    p, rate, years = r.choice([1000, 2000, 5000]), r.choice([2, 3, 4, 5]), r.choice([2, 3])
    bal = p
    steps = []
    for y in range(1, years + 1):
        new = round(bal * (1 + rate / 100), 2)
        steps.append(f"after year {y}: {bal:.2f} x 1.{rate:02d} = {new:.2f}")
        bal = new
    return (f"You deposit ${p} at {rate}% interest per year, compounded yearly. What is the balance after "
            f"{years} years?\n" + "\n".join(steps) + f"\nThe balance is ${bal:.2f}, so the interest earned is "
            f"${bal - p:.2f}.")


def _m_angles(r):
    a, b = r.randint(25, 80), r.randint(25, 80)
    return (f"Two angles of a triangle measure {a} degrees and {b} degrees. What is the third angle?\n"
            f"The angles of a triangle add up to 180 degrees, so the third angle is 180 - {a} - {b} = {180 - a - b} degrees.")


MATH_TEMPLATES += [_m_savings, _m_ratio, _m_interest, _m_angles]

MATH_NOTES += [
    "Dividing by a fraction is the same as multiplying by its reciprocal. To see why 6 / (1/2) = 12, ask "
    "how many halves fit into six: each whole holds two halves, so six wholes hold twelve.",
    "A number is divisible by 4 when the number formed by its last two digits is divisible by 4, because "
    "100 is a multiple of 4. For example, 7,316 ends in 16, which is 4 x 4, so 7,316 is divisible by 4.",
    "Rounding too early can cause errors. If a recipe needs 1.45 kg of flour per batch and you make "
    "twelve batches, rounding first to 1.5 kg gives 18 kg, while the exact amount is 17.4 kg. Round only "
    "at the end.",
    "The number of ways to arrange n different books on a shelf is n factorial: n choices for the first "
    "place, n - 1 for the second, and so on. Five books can be arranged in 5 x 4 x 3 x 2 x 1 = 120 ways.",
]
# ----------------------------------------------------------------------------------------------------
# Multilingual: handwritten paragraphs in eight languages (everyday topics). A sample is one or more
# paragraphs of the same language.
# ----------------------------------------------------------------------------------------------------
MULTI = {
    "fr": [
        "Chaque samedi matin, le marché s'installe sur la place de l'église. Les producteurs arrivent avant "
        "le lever du soleil pour disposer leurs fruits, leurs fromages et leurs fleurs. Les habitants viennent "
        "avec leurs paniers, prennent le temps de discuter et repartent souvent avec plus que prévu.",
        "Pour réussir une pâte à crêpes, il faut mélanger la farine et les œufs, puis ajouter le lait petit à "
        "petit en fouettant pour éviter les grumeaux. Une pincée de sel et un peu de beurre fondu donnent du "
        "goût. Laissez reposer la pâte une heure avant de la cuire dans une poêle bien chaude.",
        "Le train de nuit revient à la mode en Europe. Beaucoup de voyageurs préfèrent s'endormir à Paris et "
        "se réveiller à Vienne plutôt que de passer des heures à l'aéroport. Les cabines sont petites, mais "
        "le trajet fait partie du voyage et l'empreinte carbone est bien plus faible.",
        "Mon grand-père cultivait des tomates dans un petit jardin derrière la maison. Il disait qu'il fallait "
        "leur parler et les arroser le soir, jamais en plein soleil. Aujourd'hui, je garde ses graines dans une "
        "boîte en fer et je les sème chaque printemps sur mon balcon.",
        "La bibliothèque municipale propose désormais des ateliers d'informatique pour les personnes âgées. On "
        "y apprend à envoyer un courriel, à faire une visioconférence avec ses petits-enfants ou à prendre un "
        "rendez-vous médical en ligne. Les bénévoles sont patients et les séances sont gratuites.",
        "Quand il pleut toute la journée, rien ne vaut un bon livre et une tasse de thé. J'aime les romans "
        "policiers qui se déroulent dans de petits villages, où tout le monde se connaît et où chacun cache un "
        "secret. Je devine rarement le coupable avant la dernière page.",
    ],
    "de": [
        "Im Herbst wandern viele Familien in den Alpen, weil die Luft klar ist und die Wälder sich bunt färben. "
        "Auf den Almen gibt es frischen Käse und Buttermilch. Man sollte aber früh aufbrechen, denn die Tage "
        "werden kürzer und am Nachmittag zieht oft Nebel auf.",
        "Unsere Nachbarin hat im Keller eine kleine Werkstatt eingerichtet. Dort repariert sie alte Fahrräder, "
        "die sonst auf dem Sperrmüll gelandet wären, und verschenkt sie an Schüler aus der Gegend. Sie sagt, "
        "jedes Rad habe eine Geschichte und verdiene eine zweite Chance.",
        "Wer eine neue Sprache lernt, sollte jeden Tag ein wenig üben. Zehn Minuten mit Karteikarten am Morgen "
        "bringen mehr als zwei Stunden am Sonntag. Hilfreich ist auch, Filme mit Untertiteln zu schauen und "
        "laut mitzusprechen, auch wenn es am Anfang seltsam klingt.",
        "Der Zug hatte zwanzig Minuten Verspätung, aber niemand schien sich darüber zu ärgern. Ein Mann teilte "
        "seine Brezeln mit den Kindern gegenüber, und eine ältere Dame erzählte von ihrer ersten Reise nach "
        "Hamburg. Als wir endlich ankamen, fühlte es sich an, als würden wir uns schon lange kennen.",
        "Brot hat in Deutschland eine lange Tradition. Es gibt Hunderte von Sorten, vom hellen Weizenbrötchen "
        "bis zum dunklen Roggenbrot mit Körnern. Viele Bäckereien öffnen schon um sechs Uhr morgens, damit die "
        "Leute auf dem Weg zur Arbeit frische Brötchen kaufen können.",
        "Im Winter ist es in unserer Stadt früh dunkel. Dann treffen sich die Nachbarn auf dem kleinen "
        "Weihnachtsmarkt, trinken Glühwein oder heißen Kakao und hören dem Chor der Grundschule zu. Die "
        "Einnahmen der Stände gehen jedes Jahr an das örtliche Tierheim.",
    ],
    "es": [
        "En muchos pueblos de España, la vida se hace en la calle. Por la tarde, cuando baja el calor, los "
        "vecinos sacan sillas a la puerta de casa y charlan hasta la hora de cenar. Los niños juegan en la "
        "plaza y nadie tiene prisa por volver dentro.",
        "Para preparar una buena tortilla de patatas hay que tener paciencia. Las patatas se cortan finas y se "
        "fríen a fuego lento con la cebolla hasta que estén tiernas. Después se mezclan con los huevos batidos "
        "y se cuaja todo en la sartén, dándole la vuelta con ayuda de un plato.",
        "Mi hermana se mudó a Buenos Aires hace dos años para estudiar medicina. Al principio echaba de menos a "
        "la familia y la comida de casa, pero ahora dice que la ciudad es su segundo hogar. Los domingos "
        "hablamos por videollamada y me enseña las librerías que descubre.",
        "El reciclaje empieza en casa. Separar el papel, el vidrio y los envases no lleva mucho tiempo si cada "
        "cosa tiene su cubo. En nuestro barrio, el ayuntamiento instaló contenedores nuevos y en pocos meses la "
        "cantidad de basura mezclada bajó casi a la mitad.",
        "El sábado fuimos de excursión a la sierra. Subimos por un sendero entre pinos y, al llegar a la cima, "
        "vimos todo el valle cubierto de niebla. Comimos unos bocadillos sentados en las rocas y bajamos justo "
        "antes de que empezara a llover.",
        "Aprender a tocar la guitarra me ha enseñado a ser constante. Los primeros acordes me dolían en los "
        "dedos y sonaban fatal, pero practicaba un rato cada noche. Ahora puedo acompañar a mis amigos cuando "
        "cantan en las fiestas, y eso me hace muy feliz.",
    ],
    "it": [
        "A Napoli il caffè è quasi un rito. Si beve in piedi al bancone, in pochi sorsi, scambiando due parole "
        "con il barista. Esiste anche l'usanza del caffè sospeso: chi può paga un caffè in più, che verrà "
        "offerto a qualcuno che non se lo può permettere.",
        "La nonna preparava la pasta fresca ogni domenica. Impastava farina e uova su una grande tavola di "
        "legno e stendeva la sfoglia con il mattarello, sottile come un foglio di carta. Noi bambini avevamo il "
        "compito di tagliare le tagliatelle, ma spesso finivamo per mangiarne la metà crude.",
        "Venezia attira milioni di turisti ogni anno, e gli abitanti sono sempre meno. Molti appartamenti sono "
        "diventati case vacanza e i negozi di quartiere lasciano il posto a quelli di souvenir. Il comune sta "
        "provando diverse soluzioni per proteggere la città senza chiuderla ai visitatori.",
        "Ieri sera siamo andati a vedere un concerto all'aperto nel cortile del castello. L'orchestra ha "
        "suonato musiche di Verdi e Puccini, e il pubblico cantava sottovoce le arie più famose. Alla fine è "
        "cominciato a piovere, ma nessuno voleva andarsene.",
        "Il mio primo giorno di lavoro ero molto nervoso. Non conoscevo nessuno e avevo paura di sbagliare "
        "tutto. Una collega mi ha mostrato l'ufficio, mi ha presentato al resto del gruppo e a pranzo mi ha "
        "raccontato i suoi errori del primo anno. Da quel momento mi sono sentito meglio.",
        "In primavera le colline della Toscana diventano verdissime. Si possono percorrere in bicicletta le "
        "strade bianche tra i vigneti, fermandosi nei piccoli paesi per un bicchiere d'acqua alla fontana. "
        "Bisogna però essere allenati, perché le salite sono lunghe.",
    ],
    "pt": [
        "Lisboa é uma cidade de colinas, e subir as ruas estreitas do bairro de Alfama cansa qualquer um. A "
        "recompensa chega nos miradouros, de onde se vê o rio Tejo a brilhar ao sol. À noite, de algumas "
        "tascas sai o som do fado, cantado com muita emoção.",
        "No Brasil, o almoço de domingo reúne a família inteira. Há sempre feijão, arroz, farofa e alguma "
        "carne, e cada tia traz uma sobremesa diferente. As conversas duram a tarde toda, e ninguém sai sem "
        "levar um pouco de comida para casa.",
        "Comecei a andar de bicicleta para o trabalho no ano passado. No início tinha medo do trânsito, mas a "
        "cidade construiu novas ciclovias e agora o trajeto é tranquilo. Chego mais disposto, economizo o "
        "dinheiro do ônibus e ainda faço exercício sem perceber.",
        "A minha avó tem um caderno cheio de receitas escritas à mão. Algumas páginas estão manchadas de "
        "azeite e de café, e há notas nas margens sobre quem gostou de cada prato. Quero digitalizar tudo "
        "para que os netos possam cozinhar essas receitas no futuro.",
        "A floresta amazônica é essencial para o clima do planeta. As árvores liberam umidade que forma "
        "nuvens e leva chuva para outras regiões do país. Proteger a floresta também significa proteger os "
        "povos indígenas que vivem nela há milhares de anos.",
        "Nas férias, alugamos uma casa perto da praia no Algarve. Acordávamos cedo para nadar antes de o sol "
        "ficar forte, e à tarde explorávamos as grutas de barco. O peixe grelhado do restaurante do porto era "
        "o melhor que já comi.",
    ],
    "zh": [
        "每天早上，公园里都有很多老人打太极拳。他们动作缓慢而优美，一边锻炼身体，一边和朋友聊天。"
        "有些年轻人也开始加入，他们说这样可以让紧张的心情放松下来。",
        "我最喜欢的季节是秋天。天气不冷不热，树叶慢慢变成黄色和红色。周末的时候，我常常和家人一起去山上"
        "散步，然后在路边的小店里吃一碗热乎乎的面条。",
        "学习中文的时候，汉字是最大的挑战。每个字都有自己的笔画顺序，有的字看起来很像，意思却完全不同。"
        "我的老师建议每天写二十个字，并且用它们造句，这样记得更牢。",
        "春节是中国最重要的节日。人们提前打扫房子，贴春联，买新衣服。除夕晚上，全家人坐在一起吃年夜饭，"
        "看电视里的晚会，到了午夜还会放鞭炮，迎接新的一年。",
        "现在越来越多的人用手机付款。在超市、饭馆，甚至路边的水果摊，只要扫一下二维码就可以付钱。"
        "很多年轻人出门已经不带钱包了，但是有些老人还是习惯用现金。",
        "我家附近新开了一家图书馆，里面很安静，也很明亮。周末我喜欢在那里看书、写作业。图书馆还有儿童区，"
        "小朋友可以坐在地毯上听故事，家长也可以借一些育儿方面的书。",
    ],
    "ja": [
        "日本では春になると、多くの人が桜の木の下でお花見をします。家族や友達とお弁当を持って公園に行き、"
        "花を見ながら食事やおしゃべりを楽しみます。桜の花は一週間ほどで散ってしまうので、その短さも大切にされています。",
        "私は毎朝、駅まで自転車で通っています。途中にある小さなパン屋さんでは、いつも焼きたてのパンの"
        "いい匂いがします。時間に余裕がある日は、そこでクロワッサンを一つ買ってから電車に乗ります。",
        "日本語を勉強していると、敬語の使い方が難しいと感じます。相手や場面によって言葉を変えなければならず、"
        "間違えると失礼になることもあります。でも、少しずつ慣れてくると、人との関係を大切にする文化がよく分かります。",
        "週末に友達と温泉旅館に泊まりました。山に囲まれた静かな場所で、露天風呂から紅葉がよく見えました。"
        "夜は地元の野菜や魚を使った料理がたくさん出てきて、とてもおいしかったです。",
        "最近、近所の公民館で料理教室が始まりました。参加者は学生から高齢者までさまざまで、毎回みんなで"
        "一つの料理を作って一緒に食べます。先週は手作りのうどんに挑戦しました。",
        "台風が近づいているので、今日は早めに仕事を終えて帰ることにしました。スーパーでは水やパンを買う"
        "人が多く、棚がほとんど空になっていました。窓をしっかり閉めて、静かに夜を過ごすつもりです。",
    ],
    "ru": [
        "Зимой в нашем городе рано темнеет, и вечера кажутся очень длинными. Зато по выходным мы катаемся на "
        "лыжах в лесу за рекой. После прогулки приятно пить горячий чай с вареньем и слушать, как за окном "
        "падает снег.",
        "Моя бабушка всю жизнь проработала учительницей в сельской школе. Она до сих пор помнит имена почти "
        "всех своих учеников и радуется, когда они приезжают к ней в гости. Многие из них стали врачами, "
        "инженерами и тоже учителями.",
        "Летом мы обычно уезжаем на дачу. Там растут яблони, клубника и огурцы, а вечером вся семья собирается "
        "на веранде ужинать. Дети весь день бегают на речку, а взрослые спорят о том, когда лучше поливать "
        "грядки.",
        "Изучать русский язык непросто из-за падежей. Одно и то же слово меняет окончание в зависимости от "
        "роли в предложении. Но если много читать и слушать живую речь, правильные формы постепенно начинают "
        "звучать естественно.",
        "В субботу мы ходили в Третьяковскую галерею. Больше всего мне понравились картины Левитана: тихие "
        "реки, берёзы и осенние леса. Мы провели в музее почти весь день и всё равно не успели посмотреть все "
        "залы.",
        "Недавно я начал бегать по утрам в парке возле дома. Сначала я уставал уже через пять минут, но "
        "теперь спокойно пробегаю три километра. Бегать рано утром особенно приятно, когда на дорожках почти "
        "нет людей.",
    ],
}

MULTI["fr"] += [
    "Le dimanche, mon père prépare toujours le même repas : un poulet rôti avec des pommes de terre et une "
    "salade verte. Nous nous plaignons parfois de ce manque de variété, mais en réalité, personne ne "
    "voudrait changer cette tradition.",
    "La ville a transformé une ancienne voie ferrée en promenade plantée d'arbres. Les habitants y courent, "
    "y promènent leurs chiens et s'y retrouvent le soir. Les commerçants du quartier disent que leurs "
    "affaires ont bien augmenté depuis son ouverture.",
]
MULTI["de"] += [
    "Meine Großmutter schreibt noch immer Briefe mit der Hand. Sie sagt, eine E-Mail sei schnell vergessen, "
    "aber einen Brief hebe man auf. In ihrer Schublade liegen Hunderte von Briefen aus fünfzig Jahren.",
    "Viele Städte bauen neue Radwege, damit mehr Menschen mit dem Fahrrad zur Arbeit fahren. In "
    "Kopenhagen und Amsterdam ist das längst normal. Bei uns streiten die Leute noch darüber, ob dafür "
    "Parkplätze wegfallen dürfen.",
]
MULTI["es"] += [
    "En mi ciudad hay un mercado cubierto donde compro la fruta cada semana. La señora del puesto de la "
    "esquina ya sabe lo que me gusta y siempre me guarda las mejores naranjas. A cambio, yo le cuento cómo "
    "van mis estudios.",
    "Muchos jóvenes comparten piso para ahorrar en el alquiler. Convivir con desconocidos no siempre es "
    "fácil: hay que ponerse de acuerdo sobre la limpieza, el ruido y la comida de la nevera. Con el tiempo, "
    "algunos compañeros se convierten en buenos amigos.",
]
MULTI["it"] += [
    "Il treno regionale era pieno di studenti che tornavano a casa per il fine settimana. Qualcuno "
    "dormiva, qualcuno ripassava per un esame, e due ragazzi suonavano piano la chitarra in fondo al "
    "vagone. Il viaggio è sembrato più corto del solito.",
    "Mio zio ha aperto una piccola libreria in centro. Oltre ai libri, organizza letture per bambini il "
    "sabato mattina e presentazioni di autori locali. Dice che non diventerà mai ricco, ma che non "
    "cambierebbe lavoro per nulla al mondo.",
]
MULTI["pt"] += [
    "O meu vizinho cria abelhas no quintal. No verão, ele oferece frascos de mel a todos os moradores da "
    "rua e explica às crianças como as abelhas trabalham. Graças a ele, as flores do bairro estão mais "
    "bonitas do que nunca.",
    "Aprender a nadar depois dos trinta anos foi um desafio. Nas primeiras aulas eu tinha medo de pôr a "
    "cabeça debaixo de água, mas o professor foi muito paciente. Hoje nado duas vezes por semana e sinto "
    "que ganhei uma nova liberdade.",
]
MULTI["zh"] += [
    "我的爷爷每天早上都去茶馆喝茶。他在那里和老朋友下棋、聊天，一坐就是一个上午。"
    "他说，茶馆里的消息比报纸上的还多。",
    "这个城市的地铁又快又方便，但是上下班的时候人特别多。很多人在车上看手机、听音乐，"
    "也有人闭着眼睛休息。周末的时候，车厢里就安静多了。",
]
MULTI["ja"] += [
    "祖母は毎年、梅の実で梅干しを作ります。塩に漬けてから、夏の晴れた日に三日間ほど外で干します。"
    "家族みんなで手伝うので、それが夏の楽しみの一つになっています。",
    "新しい仕事を始めてから三か月が経ちました。最初は分からないことばかりでしたが、先輩がていねいに"
    "教えてくれたので、少しずつ自信がついてきました。来月は初めて一人でお客さんに会います。",
]
MULTI["ru"] += [
    "Мой сосед по вечерам играет на скрипке. Сначала это немного мешало, но теперь я жду его музыку и "
    "даже расстраиваюсь, когда он уезжает. Недавно он пригласил весь подъезд на свой концерт.",
    "Осенью мы всей семьёй ходим в лес за грибами. Папа знает самые хорошие места и встаёт раньше всех. "
    "Вечером мы чистим грибы на кухне, а на следующий день бабушка варит из них суп.",
]
# ----------------------------------------------------------------------------------------------------
# Structured: records drawn from handwritten field vocabularies, rendered as JSON, JSON Lines, CSV,
# Markdown tables, YAML and log lines. Calibration and evaluation use different schemas.
# ----------------------------------------------------------------------------------------------------
FIRST = ["Alice", "Bruno", "Carmen", "Deepak", "Eva", "Felix", "Gita", "Hamid", "Iris", "Jun", "Kalani",
         "Liam", "Maya", "Noor", "Olga", "Pedro", "Rania", "Sven", "Tomas", "Yuki", "Zara"]
LAST = ["Andersen", "Brooks", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haas", "Ito", "Jensen",
        "Kowalski", "Lopez", "Moreau", "Nakamura", "Okafor", "Petrov", "Quinn", "Rossi", "Silva", "Tanaka"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Toronto", "Osaka", "Lyon", "Krakow", "Austin", "Seville", "Dublin",
          "Porto", "Leeds", "Hanoi", "Quito", "Perth", "Bergen", "Turin", "Accra", "Denver", "Malmo"]


def _person(r):
    return f"{r.choice(FIRST)} {r.choice(LAST)}"


def _date(r, year=2024):
    return f"{year}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"


def _employee(r):
    return {"employee_id": f"E{r.randint(1000, 9999)}", "name": _person(r),
            "department": r.choice(["Sales", "Engineering", "Finance", "Support", "Marketing", "Legal"]),
            "office": r.choice(CITIES), "start_date": _date(r, r.randint(2012, 2024)),
            "salary": r.randrange(38000, 140000, 500), "remote": r.choice([True, False])}


def _product(r):
    kind = r.choice(["desk lamp", "water bottle", "backpack", "keyboard", "kettle", "yoga mat", "headphones",
                     "notebook", "umbrella", "coffee grinder", "bike light", "phone stand"])
    return {"sku": f"{kind[:3].upper()}-{r.randint(100, 999)}", "name": f"{r.choice(['Basic', 'Pro', 'Eco', 'Mini', 'Classic'])} {kind}",
            "price": round(r.uniform(4, 180), 2), "currency": r.choice(["EUR", "USD", "GBP"]),
            "in_stock": r.randint(0, 250), "tags": r.sample(["sale", "new", "gift", "outdoor", "office", "kitchen"], 2)}


def _order(r):
    n = r.randint(1, 3)
    items = [{"sku": f"SKU{r.randint(10, 99)}", "qty": r.randint(1, 4), "unit_price": round(r.uniform(3, 60), 2)}
             for _ in range(n)]
    return {"order_id": r.randint(100000, 999999), "customer": _person(r), "placed": _date(r),
            "status": r.choice(["pending", "shipped", "delivered", "cancelled", "returned"]),
            "items": items, "total": round(sum(i["qty"] * i["unit_price"] for i in items), 2),
            "ship_to": {"city": r.choice(CITIES), "postcode": str(r.randint(10000, 99999))}}


def _weather(r):
    return {"station": r.choice(CITIES), "date": _date(r), "temp_min_c": r.randint(-12, 18),
            "temp_max_c": r.randint(19, 38), "rain_mm": round(r.uniform(0, 30), 1),
            "wind_kmh": r.randint(0, 70), "sky": r.choice(["clear", "cloudy", "overcast", "showers", "fog", "snow"])}


def _book(r):
    return {"title": r.choice(["The Quiet Harbour", "Notes on Glass", "A River in Winter", "Small Machines",
                               "The Salt Road", "Letters to a Gardener", "North of Midnight", "The Paper Orchard"]),
            "author": _person(r), "year": r.randint(1950, 2024), "pages": r.randint(120, 720),
            "genre": r.choice(["mystery", "history", "poetry", "science", "travel", "fantasy"]),
            "rating": round(r.uniform(2.5, 5.0), 1)}


def _flight(r):
    a, b = r.sample(["LIS", "OSL", "NBO", "YYZ", "KIX", "LYS", "KRK", "AUS", "SVQ", "DUB", "OPO", "HAN"], 2)
    return {"flight": f"{r.choice(['TP', 'SK', 'KQ', 'AC', 'JL', 'FR'])}{r.randint(100, 2999)}", "from": a, "to": b,
            "departs": f"{r.randint(0, 23):02d}:{r.choice(['05', '20', '35', '50'])}", "gate": f"{r.choice('ABCD')}{r.randint(1, 40)}",
            "seats_free": r.randint(0, 60), "delayed": r.random() < 0.3}


def _lab(r):
    return {"sample": f"S-{r.randint(1, 500):04d}", "assay": r.choice(["pH", "turbidity", "nitrate", "lead", "coliform"]),
            "value": round(r.uniform(0.01, 9.9), 3), "unit": r.choice(["mg/L", "NTU", "pH", "CFU/100mL"]),
            "technician": r.choice(FIRST), "passed_qc": r.random() < 0.85}


def _movie(r):
    return {"film": r.choice(["Blue Lanterns", "The Last Ferry", "Copper Sky", "Midnight Orchard Run",
                              "Seven Quiet Rooms", "Paper Tigers Dance"]),
            "director": _person(r), "released": r.randint(1972, 2024), "minutes": r.randint(84, 171),
            "box_office_musd": round(r.uniform(0.5, 410), 1), "language": r.choice(["en", "fr", "ja", "es", "ko"])}


def _booking(r):
    return {"booking_ref": "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6)),
            "guest": _person(r), "hotel": f"Hotel {r.choice(['Aurora', 'Mirador', 'Lindenhof', 'Sakura', 'Bellavista'])}",
            "check_in": _date(r, 2025), "nights": r.randint(1, 9), "room": r.choice(["single", "double", "suite", "twin"]),
            "breakfast": r.choice([True, False])}


CAL_SCHEMAS = {"employees": _employee, "products": _product, "orders": _order, "weather": _weather, "books": _book}
EVAL_SCHEMAS = {"flights": _flight, "lab_results": _lab, "films": _movie, "bookings": _booking}


def _flat(rec):
    """Flatten nested values for tabular formats (CSV, Markdown, log lines)."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        elif isinstance(v, list):
            out[k] = ";".join(x if isinstance(x, str) else json.dumps(x, separators=(",", ":")) for x in v)
        else:
            out[k] = v
    return out


def _fmt_value(v):
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def render_records(r, name, records, fmt):
    """Render records in one of the structured formats, with a short natural caption."""
    if fmt == "json":
        body = json.dumps(records, indent=2, ensure_ascii=False)
        return f"{name}.json\n{body}"
    if fmt == "jsonl":
        return "\n".join(json.dumps(x, ensure_ascii=False) for x in records)
    flat = [_flat(x) for x in records]
    cols = list(flat[0])
    if fmt == "csv":
        lines = [",".join(cols)] + [",".join(_csv_cell(_fmt_value(x[c])) for c in cols) for x in flat]
        return f"# {name}.csv\n" + "\n".join(lines)
    if fmt == "markdown":
        head = "| " + " | ".join(cols) + " |\n|" + "|".join("---" for _ in cols) + "|\n"
        rows = "\n".join("| " + " | ".join(_fmt_value(x[c]) for c in cols) + " |" for x in flat)
        return f"Table: {name.replace('_', ' ')}\n\n{head}{rows}"
    if fmt == "yaml":
        out = [f"{name}:"]
        for x in flat:
            first = True
            for c in cols:
                out.append(("  - " if first else "    ") + f"{c}: {_fmt_value(x[c])}")
                first = False
        return "\n".join(out)
    if fmt == "log":
        return "\n".join(f"{_date(r)}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z "
                         f"{r.choice(['INFO', 'INFO', 'INFO', 'WARN', 'DEBUG'])} {name} "
                         + " ".join(f"{c}={_fmt_value(x[c])}" for c in cols) for x in flat)
    raise ValueError(f"unknown structured format {fmt!r}")


def _csv_cell(s):
    # RFC 4180 quoting: wrap cells holding a comma or quote, double the inner quotes.
    return '"' + s.replace('"', '""') + '"' if ("," in s or '"' in s) else s


STRUCT_FORMATS = ["json", "jsonl", "csv", "markdown", "yaml", "log"]

# ----------------------------------------------------------------------------------------------------
# Eval tasks with checkable answers. Facts below were written and checked by hand.
# ----------------------------------------------------------------------------------------------------
# (question, answer, answer-form instruction)
FACTUAL = [
    ("What is the capital of France?", "Paris", "Answer with only the name of the city."),
    ("What is the capital of Japan?", "Tokyo", "Answer with only the name of the city."),
    ("What is the capital of Italy?", "Rome", "Answer with only the name of the city."),
    ("What is the capital of Germany?", "Berlin", "Answer with only the name of the city."),
    ("What is the capital of Spain?", "Madrid", "Answer with only the name of the city."),
    ("What is the capital of Canada?", "Ottawa", "Answer with only the name of the city."),
    ("What is the capital of Egypt?", "Cairo", "Answer with only the name of the city."),
    ("What is the capital of Kenya?", "Nairobi", "Answer with only the name of the city."),
    ("What is the capital of Norway?", "Oslo", "Answer with only the name of the city."),
    ("What is the capital of Peru?", "Lima", "Answer with only the name of the city."),
    ("What is the capital of the United Kingdom?", "London", "Answer with only the name of the city."),
    ("What is the capital of Russia?", "Moscow", "Answer with only the name of the city."),
    ("Which planet is closest to the Sun?", "Mercury", "Answer with only the name of the planet."),
    ("Which planet is known as the Red Planet?", "Mars", "Answer with only the name of the planet."),
    ("What is the largest planet in our solar system?", "Jupiter", "Answer with only the name of the planet."),
    ("How many days are there in a week?", "7", "Answer with only the number."),
    ("How many legs does a spider have?", "8", "Answer with only the number."),
    ("How many continents are there on Earth?", "7", "Answer with only the number."),
    ("How many minutes are in one hour?", "60", "Answer with only the number."),
    ("How many sides does a hexagon have?", "6", "Answer with only the number."),
    ("How many months are in a year?", "12", "Answer with only the number."),
    ("At what temperature in degrees Celsius does water freeze at sea level?", "0", "Answer with only the number."),
    ("In which year did the Apollo 11 mission land on the Moon?", "1969", "Answer with only the year."),
    ("In which year did the Berlin Wall fall?", "1989", "Answer with only the year."),
    ("What is the chemical symbol for gold?", "Au", "Answer with only the symbol."),
    ("What is the chemical symbol for sodium?", "Na", "Answer with only the symbol."),
    ("What is the chemical formula of water?", "H2O", "Answer with only the formula."),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare", "Answer with only the full name."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Answer with only the full name."),
    ("Who developed the theory of general relativity?", "Albert Einstein", "Answer with only the full name."),
    ("What is the largest ocean on Earth?", "Pacific", "Answer with only one word."),
    ("What is the longest river in South America?", "Amazon", "Answer with only one word."),
    ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide", "Answer with only the name of the gas."),
    ("What is the hardest natural substance?", "diamond", "Answer with only one word."),
    ("What colour do you get by mixing blue and yellow paint?", "green", "Answer with only one word."),
    ("What is the opposite of 'hot'?", "cold", "Answer with only one word."),
    ("What is the plural of 'mouse'?", "mice", "Answer with only one word."),
    ("Which animal is known as the king of the jungle?", "lion", "Answer with only one word."),
    ("What is the main language spoken in Brazil?", "Portuguese", "Answer with only the name of the language."),
    ("What is the currency of Japan?", "yen", "Answer with only the name of the currency."),
    ("What is the tallest mountain on Earth above sea level?", "Mount Everest", "Answer with only the name of the mountain."),
    ("On which continent is Egypt?", "Africa", "Answer with only the name of the continent."),
    ("What is the freezing point of water in degrees Fahrenheit?", "32", "Answer with only the number."),
    ("How many bones are in the adult human body?", "206", "Answer with only the number."),
    ("What is the square root of 81?", "9", "Answer with only the number."),
    ("Which organ pumps blood around the human body?", "heart", "Answer with only one word."),
    ("What is the first letter of the English alphabet?", "A", "Answer with only the letter."),
    ("What is the smallest prime number?", "2", "Answer with only the number."),
    ("Which metal is liquid at room temperature?", "mercury", "Answer with only one word."),
    ("What do bees make?", "honey", "Answer with only one word."),
]

# (question, [correct, wrong, wrong, wrong]); the builder shuffles the options with the seed.
MULTIPLE_CHOICE = [
    ("Which of these is a mammal?", ["dolphin", "shark", "trout", "octopus"]),
    ("Which of these is the largest?", ["an elephant", "a cat", "a mouse", "a rabbit"]),
    ("What is 3 + 4?", ["7", "6", "8", "12"]),
    ("Which colour is the sky on a clear day?", ["blue", "green", "red", "brown"]),
    ("Which of these is a fruit?", ["apple", "carrot", "potato", "onion"]),
    ("What is the capital of France?", ["Paris", "Lyon", "Marseille", "Nice"]),
    ("How many days are in a leap year?", ["366", "365", "364", "360"]),
    ("Which planet do we live on?", ["Earth", "Mars", "Venus", "Saturn"]),
    ("Which animal says 'moo'?", ["cow", "dog", "cat", "duck"]),
    ("What do you use to write on a blackboard?", ["chalk", "a spoon", "a pillow", "a shoe"]),
    ("Which season comes after winter?", ["spring", "summer", "autumn", "winter again"]),
    ("Which of these is a programming language?", ["Python", "Granite", "Tulip", "Falcon Bay"]),
    ("What is the boiling point of water at sea level in degrees Celsius?", ["100", "50", "90", "212"]),
    ("Which gas do humans need to breathe to live?", ["oxygen", "helium", "neon", "chlorine"]),
    ("Which instrument has black and white keys?", ["piano", "violin", "trumpet", "drum"]),
    ("What is 10 x 10?", ["100", "20", "1000", "110"]),
    ("Which ocean lies between Europe and North America?", ["Atlantic", "Pacific", "Indian", "Arctic"]),
    ("Who wrote 'Pride and Prejudice'?", ["Jane Austen", "Charles Dickens", "Mark Twain", "Leo Tolstoy"]),
    ("Which element has the chemical symbol O?", ["oxygen", "gold", "osmium", "iron"]),
    ("What is the largest planet in the solar system?", ["Jupiter", "Earth", "Mars", "Mercury"]),
    ("Which of these numbers is prime?", ["13", "15", "21", "27"]),
    ("Which country is home to the kangaroo?", ["Australia", "Canada", "Norway", "Chile"]),
    ("What is the main ingredient of guacamole?", ["avocado", "tomato", "banana", "rice"]),
    ("How many sides does a triangle have?", ["3", "4", "5", "6"]),
    ("Which of these is a primary colour of light?", ["green", "orange", "purple", "pink"]),
    ("Which language has the most native speakers?", ["Mandarin Chinese", "French", "German", "Italian"]),
    ("What does a thermometer measure?", ["temperature", "weight", "distance", "speed"]),
    ("Which of these animals can fly?", ["bat", "penguin", "ostrich", "kiwi"]),
    ("In which continent is Brazil?", ["South America", "Africa", "Europe", "Asia"]),
    ("What is the freezing point of water in degrees Celsius?", ["0", "10", "-10", "32"]),
    ("Which unit is used to measure electrical resistance?", ["ohm", "volt", "watt", "ampere"]),
    ("Which of these is the smallest unit of length?", ["millimetre", "centimetre", "metre", "kilometre"]),
    ("Who was the first person to walk on the Moon?", ["Neil Armstrong", "Yuri Gagarin", "Buzz Aldrin", "John Glenn"]),
    ("What is half of 50?", ["25", "20", "30", "100"]),
    ("Which word is a verb?", ["run", "blue", "table", "happy"]),
    ("Which of these is a synonym of 'happy'?", ["joyful", "tired", "angry", "hungry"]),
    ("Which of these is the opposite of 'ancient'?", ["modern", "old", "historic", "dusty"]),
    ("What is the chemical formula of table salt?", ["NaCl", "H2O", "CO2", "KCl"]),
    ("Which data structure works on a first-in, first-out basis?", ["queue", "stack", "tree", "hash set"]),
    ("Which country has the city of Kyoto?", ["Japan", "China", "South Korea", "Thailand"]),
    ("How many hours are there in two days?", ["48", "24", "36", "72"]),
    ("Which vitamin does the skin produce in sunlight?", ["vitamin D", "vitamin C", "vitamin A", "vitamin K"]),
    ("Which part of the plant absorbs water from the soil?", ["roots", "flowers", "leaves", "petals"]),
    ("Which of these is an even number?", ["14", "9", "17", "21"]),
    ("Which material is magnetic?", ["iron", "wood", "glass", "plastic"]),
]

# Material for the generated tasks (json_extraction, formatting).
TASK_WORDS = ["river", "lantern", "pencil", "garden", "window", "marble", "rocket", "violin", "castle", "meadow",
              "ticket", "basket", "orange", "planet", "forest", "silver", "kitten", "harbor", "candle", "mirror"]
TASK_PHRASES = ["good morning", "the quick brown fox", "open the door", "happy birthday", "see you soon",
                "blue sky", "fresh bread", "thank you very much", "north wind", "little red boat",
                "hello world", "paper plane", "quiet library", "green tea"]
JOBS = ["teacher", "nurse", "engineer", "baker", "pilot", "farmer", "architect", "librarian", "chef", "painter"]
PETS = ["dog", "cat", "parrot", "rabbit", "hamster", "turtle"]

# ----------------------------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------------------------
EVAL_EVERY = 4  # item i of every pool goes to evaluation when i % EVAL_EVERY == EVAL_EVERY - 1


def _split(items, part):
    """The calibration ("cal") or evaluation ("eval") share of a pool; the two never overlap."""
    if part not in ("cal", "eval"):
        raise ValueError(f"part must be 'cal' or 'eval', got {part!r}")
    keep_eval = part == "eval"
    return [x for i, x in enumerate(items) if (i % EVAL_EVERY == EVAL_EVERY - 1) == keep_eval]


class TokenCounter:
    """Counts SmolLM2 tokens (no special tokens) with the `tokenizers` library; cached per text."""

    def __init__(self, path: Path | None = None):
        from tokenizers import Tokenizer

        if path is None:
            from accel.models import resolve_model

            path = resolve_model("smollm2-135m", pull_if_missing=True) / "tokenizer.json"

        if not path.exists():
            raise FileNotFoundError(f"tokenizer not found at {path}; the SmolLM2 folder is needed to count tokens")
        self._tok = Tokenizer.from_file(str(path))
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        n = self._cache.get(text)
        if n is None:
            n = len(self._tok.encode(text, add_special_tokens=False).ids)
            self._cache[text] = n
        return n


def bucket_of(n: int) -> str:
    """Label of the length bucket holding n tokens: '<=64', '65-256', '257-1024', '>1024'."""
    lo = 1
    for hi in BUCKETS:
        if n <= hi:
            return f"<={hi}" if lo == 1 else f"{lo}-{hi}"
        lo = hi + 1
    return f">{BUCKETS[-1]}"


_SENT_END = "。！？.!?"


def _sentences(text: str) -> list[str]:
    out, cur = [], ""
    for i, ch in enumerate(text):
        cur += ch
        nxt = text[i + 1] if i + 1 < len(text) else " "
        if ch in _SENT_END and (ch in "。！？" or nxt == " "):
            out.append(cur.strip())
            cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def _joiner_for(lang: str) -> str:
    return "" if lang in ("zh", "ja") else " "


class Pool:
    """Draws items without replacement; refills (reshuffled) only when `cycle` is set."""

    def __init__(self, rng: random.Random, items, cycle=False):
        self.rng, self.items, self.cycle = rng, list(items), cycle
        self._left: list = []
        self._refill()

    def _refill(self):
        self._left = list(self.items)
        self.rng.shuffle(self._left)

    def __call__(self):
        if not self._left:
            if not self.cycle:
                return None
            self._refill()
        return self._left.pop()


def compose(count, unit_fn, lo, hi, joiner="\n\n", prefix="", max_rejects=12):
    """Join units from unit_fn until the text has lo..hi tokens; None when that fails."""
    parts, rejects = [], 0
    while True:
        unit = unit_fn()
        if unit is None:
            return None
        text = prefix + joiner.join(parts + [unit])
        n = count(text)
        if n > hi:
            rejects += 1
            if rejects > max_rejects:
                return None
            continue
        parts.append(unit)
        if n >= lo:
            return text


# --- per-domain sample makers: (rng, part, count, lo, hi) -> (text, source) or None ---------------------

# Instructions are split by part too: a shared 50-character instruction would make eval overlap calibration.
_SUMMARY_LEADS = {"cal": ["Summarize the following passage in one sentence.",
                          "Write a one-sentence summary of the text below.",
                          "Read the passage and give its main point in a single sentence."],
                  "eval": ["Sum up this text in a sentence.", "In one sentence, what is this about?"]}


def make_prose(r, part, count, lo, hi):
    items = _split(PROSE, part)
    if hi <= 64:
        summary, para = r.choice(items)
        sents = _sentences(para)
        k = r.randint(1, 2)
        text = r.choice([summary, " ".join(sents[:k]), " ".join(sents[-k:])])
        return (text, "handwritten") if count(text) <= hi else None
    fmt = r.choice(["paragraphs", "paragraphs", "summarize", "article"])
    pool = Pool(r, items)
    if fmt == "paragraphs":
        text = compose(count, lambda: (lambda x: x and x[1])(pool()), lo, hi)
        return text and (text, "handwritten")
    if fmt == "article":
        def unit():
            x = pool()
            return x and f"{x[0].rstrip('.')}\n\n{x[1]}"
        text = compose(count, unit, lo, hi, joiner="\n\n* * *\n\n")
        return text and (text, "handwritten")
    lead = r.choice(_SUMMARY_LEADS[part])

    def unit():
        x = pool()
        return x and f"{lead}\n\n{x[1]}\n\nSummary: {x[0]}"
    text = compose(count, unit, lo, hi, joiner="\n\n---\n\n")
    return text and (text, "template:summarize")


def make_chat(r, part, count, lo, hi):
    pairs = _split(CHAT, part)
    systems = _split(SYSTEM_LINES, part)
    pool = Pool(r, pairs)
    prefix = f"System: {r.choice(systems)}\n" if r.random() < 0.35 else ""
    text = compose(count, lambda: (lambda x: x and f"User: {x[0]}\nAssistant: {x[1]}")(pool()), lo, hi,
                   joiner="\n", prefix=prefix)
    return text and (text, "handwritten")


_FENCE_LEADS = {"cal": ["Here is the {lang} version:", "The {lang} snippet:", "For comparison, in {lang}:",
                        "A {lang} example from the same project:"],
                "eval": ["And the {lang} code:", "In {lang}:", "Next, {lang}:"]}


def make_code(r, part, count, lo, hi):
    snippets = _split(CODE, part)
    langs = sorted({lang for lang, _ in snippets})
    if hi <= 1024 and r.random() < 0.75:
        lang = r.choice(langs)
        pool = Pool(r, [s for l, s in snippets if l == lang])
        header = r.choice(CODE_HEADERS[lang]) + "\n\n" if r.random() < 0.4 and hi > 64 else ""
        text = compose(count, pool, lo, hi, joiner="\n\n\n", prefix=header)
        return text and (text, "handwritten")
    pool = Pool(r, snippets)

    def unit():
        x = pool()
        return x and f"{r.choice(_FENCE_LEADS[part]).format(lang=x[0])}\n\n```{x[0]}\n{x[1]}\n```"
    text = compose(count, unit, lo, hi, joiner="\n\n")
    return text and (text, "handwritten")


def make_math(r, part, count, lo, hi):
    templates = _split(MATH_TEMPLATES, part)
    notes = _split(MATH_NOTES, part)
    note_pool = Pool(r, notes)

    def unit():
        if r.random() < 0.2:
            note = note_pool()
            if note is not None:
                return note
        return r.choice(templates)(r).strip()
    text = compose(count, unit, lo, hi, max_rejects=30)
    return text and (text, "template:math_word_problems")


def make_structured(r, part, count, lo, hi):
    schemas = CAL_SCHEMAS if part == "cal" else EVAL_SCHEMAS
    name = r.choice(sorted(schemas))
    fmt = r.choice(STRUCT_FORMATS)
    if hi <= 64:
        rec = _flat(schemas[name](r))
        keys = r.sample(list(rec), min(len(rec), 3))
        text = json.dumps({k: rec[k] for k in keys}, ensure_ascii=False)
        return (text, "template:records") if count(text) <= hi else None
    records = []
    text = None
    for _ in range(200):
        records.append(schemas[name](r))
        cand = render_records(r, name, records, fmt)
        n = count(cand)
        if n > hi:
            break
        text = cand
        if n >= lo:
            return text, "template:records"
    return None


def make_multilingual(r, part, count, lo, hi):
    langs = sorted(MULTI)
    if hi <= 64:
        lang = r.choice(langs)
        sents = _sentences(r.choice(_split(MULTI[lang], part)))
        i = r.randrange(len(sents))
        text = _joiner_for(lang).join(sents[i:i + r.randint(1, 2)])
        return (text, "handwritten") if count(text) <= hi else None
    if r.random() < (0.7 if hi <= 256 else 0.5):
        lang = r.choice(langs)
        pool = Pool(r, _split(MULTI[lang], part))
        text = compose(count, pool, lo, hi)
        if text:
            return text, "handwritten"
    pool = Pool(r, [(lang, p) for lang in langs for p in _split(MULTI[lang], part)])
    text = compose(count, lambda: (lambda x: x and f"[{x[0]}]\n{x[1]}")(pool()), lo, hi)
    return text and (text, "handwritten")


MAKERS: dict[str, Callable] = {"chat": make_chat, "code": make_code, "math": make_math, "prose": make_prose,
                               "structured": make_structured, "multilingual": make_multilingual}


def _bucket_ranges():
    lo, out = 1, []
    for hi in BUCKETS:
        out.append((lo, hi))
        lo = hi + 1
    out.append((lo, 2 * BUCKETS[-1]))
    return out


DROPPED: dict[str, int] = {}  # eval candidates dropped by the overlap safety net, per domain (reported by main)


def build_text_set(domain, part, plan, count, seed, reject=None):
    """Samples for one domain: plan is [(lo, hi, n)], reject(text) -> True drops a candidate (disjointness)."""
    r = random.Random(f"{seed}-{domain}-{part}")
    out, seen = [], set()
    for lo, hi, n in plan:
        got, attempts = 0, 0
        while got < n:
            attempts += 1
            if attempts > 400 * n:
                raise RuntimeError(f"{domain}/{part}: could only make {got}/{n} samples with {lo}-{hi} tokens")
            # Aim at a log-uniform target inside the bucket so lengths spread over it instead of
            # bunching at its lower bound (makers stop adding pieces once they pass the target).
            target = round(math.exp(r.uniform(math.log(lo), math.log(hi)))) if hi > 64 else lo
            made = MAKERS[domain](r, part, count, target, hi)
            if made is None:
                continue
            text, source = made
            if text in seen or not (lo <= count(text) <= hi):
                continue
            if reject is not None and reject(text):
                DROPPED[domain] = DROPPED.get(domain, 0) + 1
                continue
            seen.add(text)
            out.append((text, source))
            got += 1
    r.shuffle(out)
    return out

# --- eval tasks -------------------------------------------------------------------------------------------

def _task_arithmetic(r):
    items = []
    for i in range(14):  # easy: single operation on one-digit numbers (SmolLM2-135M gets many of these)
        a, b = r.randint(1, 9), r.randint(1, 9)
        op = ["+", "+", "-", "times"][i % 4]
        if op == "-":
            a, b = max(a, b), min(a, b)
        val = a + b if op == "+" else a - b if op == "-" else a * b
        q = r.choice([f"What is {a} {op} {b}?", f"How much is {a} {op} {b}?"])
        items.append((f"{q} Answer with only the number.", str(val)))
    for _ in range(14):  # medium: two-digit numbers, division with whole results
        kind = r.choice(["add", "sub", "mul", "div"])
        if kind == "add":
            a, b = r.randint(20, 99), r.randint(20, 99)
            q, val = f"What is {a} + {b}?", a + b
        elif kind == "sub":
            a, b = r.randint(50, 199), r.randint(10, 49)
            q, val = f"What is {a} - {b}?", a - b
        elif kind == "mul":
            a, b = r.randint(11, 25), r.randint(3, 12)
            q, val = f"What is {a} times {b}?", a * b
        else:
            b, val = r.randint(2, 12), r.randint(3, 15)
            q = f"What is {b * val} divided by {b}?"
        items.append((f"{q} Answer with only the number.", str(val)))
    for _ in range(8):  # mixed operations with precedence
        a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(1, 20)
        form = r.choice(["{a} * {b} + {c}", "{c} + {a} * {b}", "({a} + {b}) * {c}", "{a} * ({c} - {b})"])
        expr = form.format(a=a, b=b, c=c)
        val = eval(expr)  # our own expression string: digits, + - * and brackets only
        items.append((f"Evaluate {expr}. Answer with only the number.", str(val)))
    names = r.sample(["Lucia", "Tom", "Aiko", "Marcus", "Fatima", "Ivan", "Chen", "Sofia", "Kwame", "Hannah"], 10)
    stories = [
        lambda n, a, b: (f"{n} has {a} stickers and gets {b} more. How many stickers does {n} have?", a + b),
        lambda n, a, b: (f"A box holds {a} pencils. {n} takes out {min(a - 1, b)}. How many pencils are left in the box?", a - min(a - 1, b)),
        lambda n, a, b: (f"{n} reads {b % 9 + 2} pages every day for {a % 6 + 3} days. How many pages is that in total?", (b % 9 + 2) * (a % 6 + 3)),
        lambda n, a, b: (f"Tickets cost {b % 7 + 3} euros each. {n} buys {a % 5 + 2} tickets. How many euros does {n} pay?", (b % 7 + 3) * (a % 5 + 2)),
        lambda n, a, b: (f"{n} shares {(a % 5 + 2) * 4} sweets equally among 4 friends. How many sweets does each friend get?", a % 5 + 2),
    ]
    for i, n in enumerate(names):
        q, val = stories[i % len(stories)](n, r.randint(10, 40), r.randint(3, 30))
        items.append((f"{q} Answer with only the number.", str(val)))
    return [{"prompt": p, "answer": a, "match": "number"} for p, a in items]


def _task_json_extraction(r):
    items = []
    people = [(f"{r.choice(FIRST)} {r.choice(LAST)}", r.randint(19, 78), r.choice(CITIES), r.choice(JOBS))
              for _ in range(60)]
    forms = [
        ("{name} is {age} years old and lives in {city}.", ["name", "age", "city"]),
        ("Meet {name}, {a_job} from {city}.", ["name", "job", "city"]),
        ("Last year {name} moved to {city}, where the {age}-year-old now works as {a_job}.", ["name", "age", "city", "job"]),
        ("Our new {job}, {name}, is {age}.", ["name", "job", "age"]),
        ("{name} ({age}) works as {a_job}.", ["name", "age", "job"]),
    ]
    for i, (name, age, city, job) in enumerate(people[:30]):
        form, keys = forms[i % len(forms)]
        a_job = ("an " if job[0] in "aeiou" else "a ") + job
        text = form.format(name=name, age=age, city=city, job=job, a_job=a_job)
        gold = {k: {"name": name, "age": age, "city": city, "job": job}[k] for k in keys}
        spec = ", ".join(f'"{k}" ({"number" if k == "age" else "string"})' for k in keys)
        items.append((f"Extract the information from the text below into a JSON object with the keys {spec}. "
                      f"Reply with only the JSON object.\nText: {text}", gold))
    products = ["umbrella", "teapot", "backpack", "lamp", "scarf", "notebook", "kettle", "mug", "helmet", "radio"]
    for i in range(12):
        item, qty, price = r.choice(products), r.randint(1, 9), r.randint(2, 90)
        text = r.choice([f"I would like to order {qty} of the {item}s at {price} dollars each.",
                         f"Order: {item}, quantity {qty}, unit price {price} dollars.",
                         f"Please send {qty} {item}s; the listed price is {price} dollars per piece."])
        gold = {"item": item, "quantity": qty, "price": price}
        items.append(("Read the order below and return a JSON object with the keys \"item\" (string, singular), "
                      "\"quantity\" (number) and \"price\" (number, per piece). Reply with only the JSON object.\n"
                      f"Order: {text}", gold))
    for i in range(8):
        name, pet, pname = r.choice(FIRST), r.choice(PETS), r.choice(["Max", "Luna", "Pip", "Coco", "Rex", "Mochi", "Olive"])
        text = f"{name} has a {pet} called {pname}."
        items.append((f"Return a JSON object with the keys \"owner\", \"animal\" and \"pet_name\" for this sentence. "
                      f"Reply with only the JSON object.\nSentence: {text}", {"owner": name, "animal": pet, "pet_name": pname}))
    return [{"prompt": p, "answer": json.dumps(g, ensure_ascii=False), "match": "json"} for p, g in items]


def _task_multiple_choice(r):
    out = []
    for q, opts in MULTIPLE_CHOICE:
        order = list(range(4))
        r.shuffle(order)
        choices = [opts[i] for i in order]
        letter = "ABCD"[order.index(0)]
        body = "\n".join(f"{l}. {c}" for l, c in zip("ABCD", choices))
        out.append({"prompt": f"{q}\n{body}\nAnswer with only the letter (A, B, C or D).", "answer": letter,
                    "choices": choices, "match": "choice"})
    return out


def _task_formatting(r):
    items = []
    words, phrases = TASK_WORDS, TASK_PHRASES
    for w in r.sample(words, 10):
        items.append((f"Repeat this word exactly: {w}\nReply with only the word.", w))
    for p in r.sample(phrases, 8):
        items.append((f"Copy the following text exactly: {p}\nReply with only the copied text.", p))
    for _ in range(8):
        ws = r.sample(words, 3)
        items.append((f"Write these words in reverse order, separated by single spaces: {' '.join(ws)}\n"
                      f"Reply with only the words.", " ".join(reversed(ws))))
    for _ in range(8):
        ws = r.sample(words, 4)
        items.append((f"Sort these words alphabetically and separate them with commas and spaces: {', '.join(ws)}\n"
                      f"Reply with only the sorted list.", ", ".join(sorted(ws))))
    for p in r.sample(phrases, 6):
        items.append((f"Replace every space in this text with a hyphen: {p}\nReply with only the result.",
                      p.replace(" ", "-")))
    for _ in range(6):
        ws = r.sample(words, r.randint(3, 5))
        items.append((f"What is the first word in this list? {' '.join(ws)}\nReply with only that word.", ws[0]))
    for _ in range(4):
        ws = r.sample(words, 3)
        items.append((f"What is the last word in this list? {' '.join(ws)}\nReply with only that word.", ws[-1]))
    return [{"prompt": p, "answer": a, "match": "exact"} for p, a in items]


def _task_factual(r):
    out = []
    for q, a, how in FACTUAL:
        out.append({"prompt": f"{q} {how}", "answer": a, "match": "number" if a.isdigit() else "exact"})
    return out


TASK_MAKERS = {"arithmetic": _task_arithmetic, "json_extraction": _task_json_extraction,
               "multiple_choice": _task_multiple_choice, "formatting": _task_formatting, "factual": _task_factual}


def build_tasks(seed, reject):
    out = {}
    for task in TASKS:
        r = random.Random(f"{seed}-task-{task}")
        rows, seen = [], set()
        for item in TASK_MAKERS[task](r):
            if item["prompt"] in seen:
                continue
            if reject(item["prompt"] + "\n" + item["answer"]):
                DROPPED[task] = DROPPED.get(task, 0) + 1
                continue
            seen.add(item["prompt"])
            rows.append(item)
        out[task] = [{"id": f"{task}-{i:04d}", "task": task, **row} for i, row in enumerate(rows, 1)]
    return out


# --- output -------------------------------------------------------------------------------------------------

def build_all(seed=SEED):
    """All files as {relative path: content}; nothing is written."""
    sys.path.insert(0, str(ROOT))
    from accel.calibration.overlap import OverlapIndex

    count = TokenCounter()
    files, cal_texts, rows_by_path = {}, [], {}
    cal_plan = [(lo, hi, n) for (lo, hi), n in zip(_bucket_ranges(), CAL_PLAN)]
    for d in DOMAINS:
        samples = build_text_set(d, "cal", cal_plan, count, seed)
        rows = [{"id": f"{d}-{i:04d}", "domain": d, "text": t, "source": s} for i, (t, s) in enumerate(samples, 1)]
        rows_by_path[f"calibration_data/{d}.jsonl"] = rows
        cal_texts += [t for t, _ in samples]
    index = OverlapIndex(cal_texts)

    def reject(text):
        return index.first_overlap(text) is not None

    for d in DOMAINS:
        samples = build_text_set(d, "eval", EVAL_PLAN, count, seed, reject=reject)
        rows_by_path[f"eval/text/{d}.jsonl"] = [
            {"id": f"eval-{d}-{i:04d}", "domain": d, "text": t, "source": s} for i, (t, s) in enumerate(samples, 1)]
    for task, rows in build_tasks(seed, reject).items():
        rows_by_path[f"eval/tasks/{task}.jsonl"] = rows
    for path, rows in rows_by_path.items():
        files[path] = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return files, rows_by_path, count


def count_table(rows_by_path, count, key="domain"):
    """Markdown table: rows = files' domain (or task), columns = length buckets, cells = sample counts."""
    labels = [bucket_of(hi) for hi in BUCKETS] + [bucket_of(BUCKETS[-1] + 1)]
    table = {}
    for rows in rows_by_path.values():
        for row in rows:
            n = count(row["text"] if "text" in row else row["prompt"])
            table.setdefault(row[key], dict.fromkeys(labels, 0))[bucket_of(n)] += 1
    lines = [f"| {key} | " + " | ".join(labels) + " | total |", "|---" * (len(labels) + 2) + "|"]
    for name, cells in table.items():
        lines.append(f"| {name} | " + " | ".join(str(cells[l]) for l in labels) + f" | {sum(cells.values())} |")
    totals = [sum(c[l] for c in table.values()) for l in labels]
    lines.append("| **all** | " + " | ".join(map(str, totals)) + f" | {sum(totals)} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild in memory and fail if the files differ")
    ap.add_argument("--table", action="store_true", help="print counts per domain/task x length bucket")
    args = ap.parse_args(argv)
    files, rows_by_path, count = build_all()
    print(f"eval candidates dropped by the overlap check: {DROPPED or 'none'}")
    if args.table:
        cal = {p: r for p, r in rows_by_path.items() if p.startswith("calibration_data/")}
        ev = {p: r for p, r in rows_by_path.items() if p.startswith("eval/text/")}
        tasks = {p: r for p, r in rows_by_path.items() if p.startswith("eval/tasks/")}
        print("calibration_data/ (tokens: SmolLM2 tokenizer, no special tokens)\n" + count_table(cal, count))
        print("\neval/text/\n" + count_table(ev, count))
        print("\neval/tasks/ (prompt tokens)\n" + count_table(tasks, count, key="task"))
        return 0
    if args.check:
        bad = [p for p, c in files.items() if not (ROOT / p).exists() or (ROOT / p).read_text(encoding="utf-8") != c]
        if bad:
            print("differs from a fresh build: " + ", ".join(bad))
            return 1
        print(f"all {len(files)} files match a fresh build")
        return 0
    for p, c in files.items():
        (ROOT / p).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / p).write_text(c, encoding="utf-8")
    print(f"wrote {len(files)} files, {sum(len(c.encode()) for c in files.values()) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
