// Messages of the actor engine: the registration that lets them cross processes.
#include "actors/internal/messages.hpp"

namespace actorpipe::internal {

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<Announcement>("actorpipe::Announcement");
  cfg.add_message_type<StageTimes>("actorpipe::StageTimes");
  cfg.add_message_type<UpdateTicket>("actorpipe::UpdateTicket");
  cfg.add_message_type<TiedAnnouncement>("actorpipe::TiedAnnouncement");
  cfg.add_message_type<SumSq>("actorpipe::SumSq");
  cfg.add_message_type<Commit>("actorpipe::Commit");
  cfg.add_message_type<Failure>("actorpipe::Failure");
  cfg.add_message_type<RunOutcome>("actorpipe::RunOutcome");
  cfg.add_message_type<MigrationEvent>("actorpipe::MigrationEvent");
  cfg.add_message_type<std::vector<StageTimes>>("std::vector<actorpipe::StageTimes>");
}

}  // namespace actorpipe::internal
