"""moto's server, with one lookup made linear.

moto finds an EC2 resource's tags by scanning every tag of every resource
with a regular expression (`TaggedEC2Resource.get_tags` calls
`describe_tags` with a `resource-id` filter), and DescribeInstances does
that for each instance several times over. With a few hundred tagged
resources one describe cost a quarter of a second of CPU, and the local
stack's EC2 endpoint took a whole core of the two this machine has. Here
a resource's tags are read from the tag backend's own map, by id: the same
list (keys in the order they were set, with the resource type) without the
scan.

moto also keeps a terminated instance for ever; EC2 forgets it about an
hour after it ended. With HANGAR_MOTO_FORGET_TERMINATED_AFTER_SECONDS set,
a terminated instance (its whole reservation, once every instance of it
has ended) is forgotten that many seconds after its termination, so a
benchmark's later runs do not describe every earlier run's instances.
Everything else is moto as released.
"""

import os
import sys
import time

from moto.ec2.models.core import TaggedEC2Resource
from moto.ec2.models.instances import InstanceBackend
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


def _forget_terminated_after(seconds):
    terminated_at = {}
    terminate = InstanceBackend.terminate_instances
    all_reservations = InstanceBackend.all_reservations

    def terminate_and_note(self, instance_ids):
        ended = terminate(self, instance_ids)
        now = time.monotonic()
        for instance, _ in ended:
            terminated_at.setdefault(instance.id, now)
        return ended

    def all_but_forgotten(self, filters=None):
        now = time.monotonic()
        for reservation_id, reservation in list(self.reservations.items()):
            ended = [terminated_at.get(i.id) for i in reservation.instances]
            if ended and all(t is not None and now - t >= seconds for t in ended):
                del self.reservations[reservation_id]
                for instance in reservation.instances:
                    terminated_at.pop(instance.id, None)
        return all_reservations(self, filters)

    InstanceBackend.terminate_instances = terminate_and_note
    InstanceBackend.all_reservations = all_but_forgotten


if os.environ.get("HANGAR_MOTO_FORGET_TERMINATED_AFTER_SECONDS"):
    _forget_terminated_after(float(os.environ["HANGAR_MOTO_FORGET_TERMINATED_AFTER_SECONDS"]))

if __name__ == "__main__":
    sys.exit(main())
