//! The SMART / Health Information log (02h) of namespaces that sit on a real drive, and
//! the SMART / Health asynchronous events their critical warnings raise.
//!
//! A backend on a real NVMe drive can read the drive's own log page 02h; the daemon hands
//! it to [`super::Target::set_device_health`] now and then (off the data path). What a
//! host then reads in Get Log Page 02h for such a namespace mixes two sources, each for
//! the fields it can answer truthfully:
//!
//! - the drive: critical warning, composite temperature and sensors, available spare and
//!   its threshold, percentage used, endurance group warning, media errors, power cycles,
//!   unsafe shutdowns, warning/critical temperature times, thermal management counters;
//! - this target: data units and commands read and written through it, power-on hours
//!   of the target and the controller's own error log count (the host asks this
//!   controller about its traffic, not about other users of the drive).
//!
//! For NSID FFFFFFFFh (or 0) the drive fields of all the subsystem's drive-backed
//! namespaces are combined the way a host reading one number expects: warnings OR-ed,
//! the hottest temperature, the lowest spare (with its own threshold), the most worn
//! drive, counts summed. Namespaces without a drive keep the software defaults (no
//! temperature, 100 % spare, no wear) and their own media error count.

use super::EventKind;
use crate::spec::log::SmartLog;

/// Critical Warning bits the target can see on a drive and report (NVMe Base 2.0 Figure
/// 207, bits 0 to 5); Asynchronous Event Configuration bits 7:0 enable them one by one.
pub(super) const CRITICAL_WARNING_BITS: u32 = 0x3f;
const SPARE_BELOW_THRESHOLD: u8 = 1 << 0;
const TEMPERATURE: u8 = 1 << 1;
const RELIABILITY: u8 = (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5);

/// The events to raise for critical-warning bits that were clear and are now set, as
/// (event, the warning bits that event reports) (Base 2.0 Figure 148: SMART / Health
/// status information 00h reliability, 01h temperature threshold, 02h spare below
/// threshold).
pub(super) fn events_for(newly_set: u8) -> impl Iterator<Item = (EventKind, u8)> {
    [
        (EventKind::SmartReliability, RELIABILITY),
        (EventKind::SmartTemperature, TEMPERATURE),
        (EventKind::SmartSpare, SPARE_BELOW_THRESHOLD),
    ]
    .into_iter()
    .filter_map(move |(kind, bits)| (newly_set & bits != 0).then_some((kind, newly_set & bits)))
}

/// Writes the drive fields of `drives` into `log` (see the module documentation); does
/// nothing when `drives` is empty.
pub(super) fn merge_drive_fields(log: &mut SmartLog, drives: &[&SmartLog]) {
    let Some(first) = drives.first() else {
        return;
    };
    if let [only] = drives {
        log.critical_warning = only.critical_warning;
        log.composite_temperature = only.composite_temperature;
        log.available_spare = only.available_spare;
        log.available_spare_threshold = only.available_spare_threshold;
        log.percentage_used = only.percentage_used;
        log.endurance_group_critical_warning = only.endurance_group_critical_warning;
        log.power_cycles = only.power_cycles;
        log.unsafe_shutdowns = only.unsafe_shutdowns;
        log.warning_temperature_time = only.warning_temperature_time;
        log.critical_temperature_time = only.critical_temperature_time;
        log.temperature_sensor = only.temperature_sensor;
        log.thermal_mgmt_temp1_transitions = only.thermal_mgmt_temp1_transitions;
        log.thermal_mgmt_temp2_transitions = only.thermal_mgmt_temp2_transitions;
        log.thermal_mgmt_temp1_time = only.thermal_mgmt_temp1_time;
        log.thermal_mgmt_temp2_time = only.thermal_mgmt_temp2_time;
        return;
    }
    let lowest_spare = drives
        .iter()
        .min_by_key(|d| d.available_spare)
        .unwrap_or(first);
    log.available_spare = lowest_spare.available_spare;
    log.available_spare_threshold = lowest_spare.available_spare_threshold;
    log.critical_warning = drives.iter().fold(0, |a, d| a | d.critical_warning);
    log.endurance_group_critical_warning = drives
        .iter()
        .fold(0, |a, d| a | d.endurance_group_critical_warning);
    log.composite_temperature = max16(drives.iter().map(|d| d.composite_temperature.get()));
    log.percentage_used = drives.iter().map(|d| d.percentage_used).max().unwrap_or(0);
    log.power_cycles = sum128(drives.iter().map(|d| d.power_cycles.get()));
    log.unsafe_shutdowns = sum128(drives.iter().map(|d| d.unsafe_shutdowns.get()));
    log.warning_temperature_time = max32(drives.iter().map(|d| d.warning_temperature_time.get()));
    log.critical_temperature_time = max32(drives.iter().map(|d| d.critical_temperature_time.get()));
    for (i, sensor) in log.temperature_sensor.iter_mut().enumerate() {
        *sensor = max16(drives.iter().map(|d| d.temperature_sensor[i].get()));
    }
    log.thermal_mgmt_temp1_transitions = max32(
        drives
            .iter()
            .map(|d| d.thermal_mgmt_temp1_transitions.get()),
    );
    log.thermal_mgmt_temp2_transitions = max32(
        drives
            .iter()
            .map(|d| d.thermal_mgmt_temp2_transitions.get()),
    );
    log.thermal_mgmt_temp1_time = max32(drives.iter().map(|d| d.thermal_mgmt_temp1_time.get()));
    log.thermal_mgmt_temp2_time = max32(drives.iter().map(|d| d.thermal_mgmt_temp2_time.get()));
}

fn max16(v: impl Iterator<Item = u16>) -> zerocopy::little_endian::U16 {
    v.max().unwrap_or(0).into()
}
fn max32(v: impl Iterator<Item = u32>) -> zerocopy::little_endian::U32 {
    v.max().unwrap_or(0).into()
}
fn sum128(v: impl Iterator<Item = u128>) -> zerocopy::little_endian::U128 {
    v.fold(0u128, |a, x| a.saturating_add(x)).into()
}
