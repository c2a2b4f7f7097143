"""Compressor configs as types: each config names its compressor and checks its options, its type chooses the
handler, and CompressConfig holds one (a name converted, the options as given recorded)."""

from __future__ import annotations

import dataclasses

import pytest

from gac.cli.options import CONFIG_FLAGS
from gac.compressors import (
    AUTO,
    HANDLERS,
    REGISTRY,
    ASVDConfig,
    AutoConfig,
    PruneConfig,
    compressor_for,
    config_for,
)
from gac.compressors.base import Compressor, LowRankCompressor
from gac.config import CompressConfig
from gac.errors import ConfigError
from gac.models.kinds.base import DimGroup


def test_each_name_is_its_config_type_and_each_type_its_handler():
    assert list(REGISTRY) == ["svd", "asvd", "svd_llm", "prune", "palu"]
    for name, config_type in REGISTRY.items():
        config = config_for(name)
        assert type(config) is config_type and config.name == name
        handler = compressor_for(config)
        assert type(handler) is HANDLERS[config_type] and handler.config is config and handler.name == name


def test_the_proxy_is_the_config_s_typed_field():
    assert compressor_for(ASVDConfig(importance="magnitude")).proxy == "magnitude"
    assert compressor_for(config_for("svd")).proxy is None  # svd: weight magnitude, its own
    assert compressor_for(PruneConfig()).proxy == "taylor"


def test_an_option_a_config_lacks_is_one_error_in_the_caller_s_words():
    with pytest.raises(ConfigError) as info:
        config_for("svd", layers="1-3")
    assert str(info.value) == "layers does not apply to compressor=svd: leave it out"
    assert info.value.worded(CONFIG_FLAGS) == "--prune-layers does not apply to --compressor svd: leave it out"
    with pytest.raises(ConfigError, match="apply to only some compressors"):
        config_for(AUTO, alpha=0.5)
    assert isinstance(config_for(AUTO), AutoConfig)


def test_options_are_those_away_from_the_defaults_and_rebuild_the_config():
    config = PruneConfig(layers="1-3", head_mode="none")
    assert config.options() == {"layers": (1, 2, 3), "head_mode": "none"}
    assert config_for("prune", **config.options()) == config
    assert config.to_dict() == {"name": "prune", **dataclasses.asdict(config)}
    assert ASVDConfig().with_options(alpha=0.5) == ASVDConfig(alpha=0.5)


def test_compress_config_converts_a_name_and_records_the_options_given():
    cfg = CompressConfig(compressor="prune", compressor_options={"head_mode": "group", "layers": "all"})
    assert cfg.compressor == PruneConfig(layers="all") and cfg.compressor.name == "prune"
    assert cfg.compressor_options == {"head_mode": "group", "layers": "all"}  # given at its default: still given
    again = dataclasses.replace(cfg, ratio=0.3)  # the config object and the record passed back
    assert again.compressor == cfg.compressor and again.compressor_options == cfg.compressor_options
    assert CompressConfig().compressor == ASVDConfig()
    assert CompressConfig(compressor_options={"alpha": 0.5}).compressor == ASVDConfig(alpha=0.5)


def test_compress_config_takes_a_config_and_reports_its_options():
    cfg = CompressConfig(compressor=PruneConfig(layers="all"), compressor_options={"head_mode": "none"})
    assert cfg.compressor == PruneConfig(layers="all", head_mode="none")
    assert cfg.compressor_options == {"head_mode": "none", "layers": "all"}
    assert isinstance(CompressConfig(compressor="auto").compressor, AutoConfig)
    with pytest.raises(ConfigError, match="does not apply"):
        CompressConfig(compressor=ASVDConfig(), compressor_options={"group_size": 2})


def test_the_interfaces_are_abstract():
    """A compressor or a group kind that leaves out what it must define fails when built, not when first asked."""

    class Unfinished(LowRankCompressor[ASVDConfig]):
        pass

    assert isinstance(Unfinished(ASVDConfig()), Compressor)  # the low-rank family defines all four
    with pytest.raises(TypeError, match="abstract"):
        Compressor(ASVDConfig())  # type: ignore[abstract]
    with pytest.raises(TypeError, match="abstract"):
        DimGroup("g", 1)  # type: ignore[abstract]
