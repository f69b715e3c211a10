"""model/strategies.py: the search a batch gets is chosen in one place, by name, and each choice
decodes as the search it names."""

import pytest
import torch

from model.graphs import GraphedBeamSearch
from model.options import DecodingOptions
from model.search import beam_search, select
from model.strategies import STRATEGIES, make_search, strategy_of
from tests.test_search import greedy_reference, sources, tiny


def hypotheses(results):
    return [[(h.token_ids, h.ended_with_eos, round(h.score, 4)) for h in each] for each in results]


@pytest.mark.parametrize("beam, name", [(1, "greedy"), (2, "beam"), (5, "beam")])
def test_the_options_name_the_strategy_and_its_width(beam, name):
    options = DecodingOptions(beam_size=beam, length_penalty=1.0)
    assert strategy_of(options) == name
    assert STRATEGIES[name](options) == beam


def test_greedy_is_the_argmax_until_eos_or_the_cap():
    m = tiny(eos_bias=1.0)
    src, caps = sources(), torch.tensor([9, 4, 9, 9])
    search = make_search(DecodingOptions(beam_size=1, length_penalty=1.0), m, select)
    assert (search.strategy, search.engine) == ("greedy", "eager")
    for row, [h] in enumerate(search.run(src, caps)):
        assert (h.token_ids, h.ended_with_eos) == greedy_reference(m, src[row], int(caps[row]))


@pytest.mark.parametrize("penalty, engine", [(1.0, "graphed"), (1.3, "eager")])
def test_the_graphed_engine_decodes_what_the_eager_one_does_and_takes_no_penalty(penalty, engine):
    """With a graphed search at hand a batch runs on it, unless it asks for what its step has not
    (a repetition penalty); either way the hypotheses are the eager search's."""
    m = tiny(eos_bias=0.0)
    src, caps = sources(), torch.tensor([12, 5, 9, 3])
    options = DecodingOptions(beam_size=3, n_best=2, length_penalty=0.6, repetition_penalty=penalty)
    search = make_search(options, m, select, GraphedBeamSearch(m, capture=False))
    assert (search.strategy, search.engine) == ("beam", engine)
    expected = beam_search(m, src, 3, 2, 0.6, caps, repetition_penalty=penalty)
    assert hypotheses(search.run(src, caps)) == hypotheses(expected)


def test_a_shortlist_is_the_eager_engines_view_of_the_vocabulary():
    """columns: the batch decodes over those target pieces only, as the shortlisted model does."""
    m = tiny(eos_bias=0.0)
    src, caps = sources(), torch.tensor([9, 9, 9, 9])
    columns = torch.tensor([0, 1, 2, 5, 7, 11, 13, 17, 19, 23, 29, 31])
    options = DecodingOptions(beam_size=2, length_penalty=1.0)
    results = make_search(options, m, select, columns=columns).run(src, caps)
    assert {t for each in results for h in each for t in h.token_ids} <= set(columns.tolist())
    assert hypotheses(results) == hypotheses(beam_search(m.shortlisted(columns), src, 2, 1, 1.0, caps))
