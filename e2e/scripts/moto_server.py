"""moto's server, with one lookup made linear.

moto finds an EC2 resource's tags by scanning every tag of every resource
with a regular expression (`TaggedEC2Resource.get_tags` calls
`describe_tags` with a `resource-id` filter), and DescribeInstances does
that for each instance several times over. With a few hundred tagged
resources one describe cost a quarter of a second of CPU, and the local
stack's EC2 endpoint took a whole core of the two this machine has. Here
a resource's tags are read from the tag backend's own map, by id: the same
list (keys in the order they were set, with the resource type) without the
scan. Everything else is moto as released.
"""

import sys

from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix
from moto.server import main


def _tags_by_id(self):
    resource_id = getattr(self, "id", None)
    if not resource_id:
        return []
    tags = self.ec2_backend.tags.get(resource_id) or {}
    kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
    return [{"resource_id": resource_id, "key": k, "value": v, "resource_type": kind} for k, v in tags.items()]


TaggedEC2Resource.get_tags = _tags_by_id

if __name__ == "__main__":
    sys.exit(main())
