"""The elastic-ctr policy pack: ``pulumi preview --policy-pack policy`` (mandatory policies;
``policy/elastic_ctr_policies.py`` has them; ``--policy-pack-config policy/prod.json``
requires images by digest)."""
from pulumi_policy import PolicyPack

from elastic_ctr_policies import POLICIES

PolicyPack(name="elastic-ctr", policies=POLICIES)
